from tests.integrations.adk_support import boss_agent

root_agent = boss_agent()
