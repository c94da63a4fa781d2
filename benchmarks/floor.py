"""(1) The floor: one pub/sub hop between two processes (PUBLISH -> the subscriber's waker task
wakes on an ``asyncio.Event``), the same hop after an owner lookup (HGET), a PING round trip,
and PINGs per second from one process. Raw redis-py asyncio, nothing of cancel-bus.

This standalone floor divides the throughput figures and the peers; every latency benchmark
also takes its own floor hops, interleaved with its samples (see ``PairedFloor``).
"""

from __future__ import annotations

from ._cluster import Bench, PairedFloor

SECTION = "floor (raw redis-py asyncio between two processes)"
OWNER_KEY = "floor:run"
THROUGHPUT_SECONDS = 2.0


async def run(bench: Bench) -> None:
    profile, report = bench.profile, bench.report
    async with bench.stage("floor") as (scope, server):
        subscriber = await scope.worker("floor-subscriber")
        publisher = await scope.worker("floor-publisher")
        floor = await PairedFloor(server, publisher, subscriber).start()
        redis = await scope.client(server)
        await redis.hset(OWNER_KEY, "owner", floor.channel)
        hop: list[int] = []
        lookup_hop: list[int] = []
        for i in range(profile.warmup + profile.n):
            plain, lookup = await floor.sample(), await floor.sample(lookup=OWNER_KEY)
            if i >= profile.warmup:
                hop.append(plain)
                lookup_hop.append(lookup)
        pings = await publisher.call("ping", url=server.url, n=profile.warmup + profile.n)
        rates = {
            concurrency: await publisher.call(
                "ping_throughput",
                url=server.url,
                concurrency=concurrency,
                seconds=THROUGHPUT_SECONDS,
            )
            for concurrency in (1, 32)
        }
    report.set_floor("hop", report.latency(SECTION, "pub/sub hop (PUBLISH -> woken)", hop))
    report.latency(SECTION, "owner lookup (HGET) + hop", lookup_hop, floor="hop")
    report.set_floor("ping", report.latency(SECTION, "PING round trip", pings[profile.warmup :]))
    for concurrency, rate in rates.items():
        name = f"PINGs/s from one process, {concurrency} in flight"
        report.set_floor(f"ping_rate_{concurrency}", report.figure(SECTION, name, rate, "/s"))
