from tests.integrations.adk_support import story_agent

root_agent = story_agent()
