"""A confluent-kafka group consumer in a process of its own, for the group tests (it can be
killed with SIGKILL). Run as ``python consumer_member.py BOOTSTRAP GROUP TOPIC CLIENT_ID
[PROTOCOL [INSTANCE_ID]]``; it prints one JSON object a line:

- {"ev": "assign"|"revoke"|"lost", "parts": [partition, ...]} from the rebalance callbacks;
- {"ev": "rec", "p": partition, "o": offset} for every record;
- {"ev": "committed", "parts": {partition: offset}} after the command "commit";
- {"ev": "error", "error": text} for errors the consumer reports.

A classic member's session timeout is $CLASSIC_SESSION_MS (6000 when unset).

Commands on stdin, one a line: "commit" (synchronous commit of the positions, then
committed()), "close" (leave the group and exit).
"""

from __future__ import annotations

import json
import os
import queue
import sys
import threading

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition


def main() -> None:
    bootstrap, group, topic, client_id = sys.argv[1:5]
    protocol = sys.argv[5] if len(sys.argv) > 5 else "consumer"
    instance_id = sys.argv[6] if len(sys.argv) > 6 else None
    out_lock = threading.Lock()

    def say(**event) -> None:
        with out_lock:
            sys.stdout.write(json.dumps(event) + "\n")
            sys.stdout.flush()

    conf = {"bootstrap.servers": bootstrap, "group.id": group, "client.id": client_id,
            "group.protocol": protocol, "auto.offset.reset": "earliest",
            "enable.auto.commit": True, "auto.commit.interval.ms": 200,
            "error_cb": lambda err: say(ev="error", error=str(err))}
    if instance_id:
        conf["group.instance.id"] = instance_id
    if protocol == "classic":
        conf.update({"session.timeout.ms": int(os.environ.get("CLASSIC_SESSION_MS", 6000)),
                     "heartbeat.interval.ms": 500,
                     "partition.assignment.strategy": "cooperative-sticky"})
    consumer = Consumer(conf)
    consumer.subscribe(
        [topic],
        on_assign=lambda c, parts: say(ev="assign", parts=sorted(p.partition for p in parts)),
        on_revoke=lambda c, parts: say(ev="revoke", parts=sorted(p.partition for p in parts)),
        on_lost=lambda c, parts: say(ev="lost", parts=sorted(p.partition for p in parts)))
    commands: queue.Queue[str] = queue.Queue()

    def read_commands() -> None:
        for line in sys.stdin:
            commands.put(line.strip())
        commands.put("close")

    threading.Thread(target=read_commands, daemon=True).start()
    while True:
        try:
            command = commands.get_nowait()
        except queue.Empty:
            command = ""
        if command == "close":
            break
        if command == "commit":
            try:
                consumer.commit(asynchronous=False)
            except KafkaException as exc:
                # _NO_OFFSET: the automatic commits already stored every position.
                if exc.args[0].code() != KafkaError._NO_OFFSET:
                    say(ev="error", error=f"commit: {exc}")
            parts = [TopicPartition(topic, p.partition) for p in consumer.assignment()]
            done = consumer.committed(parts, timeout=10)
            say(ev="committed", parts={p.partition: p.offset for p in done})
        msg = consumer.poll(0.1)
        if msg is None:
            continue
        if msg.error():
            say(ev="error", error=str(msg.error()))
            continue
        say(ev="rec", p=msg.partition(), o=msg.offset())
    consumer.close()
    say(ev="closed")


if __name__ == "__main__":
    main()
