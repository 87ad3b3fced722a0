"""The client-side commands of ``oncelog``: topics, produce, consume (simple, for humans)."""

from __future__ import annotations

import argparse
import datetime
import re
import sys
import time
import urllib.request

from ..client.admin.admin import Admin
from ..client.consumer.consumer import EARLIEST, LATEST, Consumer, TopicPartition
from ..client.network import calls
from ..client.network.connection import KafkaError
from ..client.producer.producer import Producer
from ..protocol.records import CODECS
from .client_config import client_config

DEFAULT_BOOTSTRAP = "127.0.0.1:9092"


def _admin(args: argparse.Namespace) -> Admin:
    return Admin(client_config(args))


def _key_value(items: list[str] | None, what: str) -> dict[str, str]:
    result = {}
    for item in items or []:
        if "=" not in item:
            raise SystemExit(f"oncelog: {what} expects key=value, got {item!r}")
        key, value = item.split("=", 1)
        result[key] = value
    return result


# --- topics -----------------------------------------------------------------------------------

def _topics_create(args: argparse.Namespace) -> int:
    with _admin(args) as admin:
        admin.create_topic(args.topic, args.partitions, args.replication_factor,
                           _key_value(args.config, "--config"))
    print(f"created topic {args.topic}")
    return 0


def _topics_list(args: argparse.Namespace) -> int:
    with _admin(args) as admin:
        for name in sorted(admin.metadata().topics):
            print(name)
    return 0


def _topics_describe(args: argparse.Namespace) -> int:
    with _admin(args) as admin:
        info = admin.metadata([args.topic]).topics[args.topic]
        configs = admin.describe_topic_configs(args.topic)
        # Each asked of the partition's leader (in a cluster, another broker); "-" when it
        # cannot answer (no leader now).
        keys = [(args.topic, p.index) for p in info.partitions]
        earliest = admin.list_offsets(dict.fromkeys(keys, calls.EARLIEST))
        latest = admin.list_offsets(dict.fromkeys(keys, calls.LATEST))
        offsets = [(_offset_or_dash(earliest[k]), _offset_or_dash(latest[k])) for k in keys]
        # The last stable offset: where a read_committed reader stops (before the first
        # open transaction); the high watermark when none is open.
        stable = admin.list_offsets({(args.topic, p.index): calls.LATEST
                                     for p in info.partitions}, read_committed=True)
    print(f"Topic: {args.topic}\tPartitionCount: {len(info.partitions)}\tReplicationFactor: "
          f"{len(info.partitions[0].replicas) if info.partitions else 0}")
    overrides = ",".join(f"{k}={v}" for k, (v, default) in sorted(configs.items()) if not default)
    print(f"Configs: {overrides}")
    for p, (start, end) in zip(info.partitions, offsets, strict=True):
        print(f"\tPartition: {p.index}\tLeader: {p.leader}\tReplicas: "
              f"{','.join(map(str, p.replicas))}\tIsr: {','.join(map(str, p.isr))}\t"
              f"Offsets: {start}..{end}\tLastStableOffset: "
              f"{_offset_or_dash(stable.get((args.topic, p.index)))}")
    return 0


def _offset_or_dash(offset: object) -> str:
    return str(offset) if isinstance(offset, int) else "-"


def _topics_delete(args: argparse.Namespace) -> int:
    with _admin(args) as admin:
        admin.delete_topic(args.topic)
    print(f"deleted topic {args.topic}")
    return 0


# --- producers and stats -----------------------------------------------------------------------

def _producers_describe(args: argparse.Namespace) -> int:
    with _admin(args) as admin:
        info = admin.metadata([args.topic]).topics[args.topic]
        indexes = [args.partition] if args.partition is not None else \
            [p.index for p in info.partitions]
        described = admin.describe_producers(args.topic, indexes)
    print("PARTITION\tPRODUCER_ID\tEPOCH\tLAST_SEQUENCE\tLAST_TIMESTAMP")
    for index in indexes:
        for p in sorted(described.get(index, []), key=lambda p: p.producer_id):
            print(f"{index}\t{p.producer_id}\t{p.epoch}\t{p.last_sequence}\t"
                  f"{_iso(p.last_timestamp)}")
    return 0


def _iso(ms: int) -> str:
    if ms < 0:
        return "-"
    return datetime.datetime.fromtimestamp(ms / 1000, datetime.UTC).isoformat(
        timespec="milliseconds")


def _stats(args: argparse.Namespace) -> int:
    url = f"http://{args.metrics_server}/metrics"
    try:
        with urllib.request.urlopen(url, timeout=30) as response:
            text = response.read().decode()
    except OSError as exc:
        print(f"oncelog stats: cannot read {url}: {exc}", file=sys.stderr)
        return 1
    rows = []
    for line in text.splitlines():
        match = _SAMPLE.match(line)
        if match and not match.group(1).startswith("oncelog_consumer_group"):  # by group: not here
            labels = dict(_LABEL.findall(match.group(2)))
            rows.append((labels.get("topic", ""), int(labels.get("partition", -1)),
                         labels.get("outcome", match.group(1).removeprefix("oncelog_")),
                         match.group(3)))
    print("TOPIC\tPARTITION\tWHAT\tCOUNT")
    for topic, partition, what, count in sorted(rows):
        print(f"{topic}\t{partition}\t{what}\t{count}")
    return 0


_SAMPLE = re.compile(r"^(oncelog_\w+)\{(.*)\} (\S+)$")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


# --- produce ----------------------------------------------------------------------------------

def _produce(args: argparse.Namespace) -> int:
    encoded_headers = [(k, v.encode()) for k, v in _key_value(args.header, "--header").items()]
    config = {**client_config(args), "compression.type": args.compression,
              "acks": args.acks, "batch.num.messages": args.batch_size,
              **_key_value(args.producer_property, "--producer-property")}
    try:
        producer = Producer(config)
    except ValueError as exc:
        raise SystemExit(f"oncelog produce: {exc}") from None
    separator = args.key_separator.encode() if args.key_separator else None
    failed: list[BaseException] = []
    count = 0
    with producer:
        for line in sys.stdin.buffer:
            value = line.rstrip(b"\r\n")
            key = None
            if separator is not None and separator in value:
                key, value = value.split(separator, 1)
            producer.produce(args.topic, value, key=key, partition=args.partition,
                             headers=encoded_headers,
                             on_delivery=lambda err, _meta: err and failed.append(err))
            count += 1
        try:
            producer.flush()
        except KafkaError:
            pass  # counted by on_delivery
    if failed:
        print(f"oncelog produce: {len(failed)} records not delivered: {failed[0]}",
              file=sys.stderr)
        return 1
    print(f"produced {count} records to {args.topic}", file=sys.stderr)
    return 0


# --- consume ----------------------------------------------------------------------------------

def _seek_to(consumer: Consumer, tp: TopicPartition, spec: str) -> None:
    if spec in ("earliest", "latest"):
        consumer.seek(tp, EARLIEST if spec == "earliest" else LATEST)
    elif spec.startswith("ts:") and spec[3:].isdigit():
        offset = consumer.offsets_for_times({tp: int(spec[3:])})[tp]
        consumer.seek(tp, offset if offset >= 0 else LATEST)
    elif spec.isdigit():
        consumer.seek(tp, int(spec))
    else:
        raise SystemExit(
            f"oncelog consume: --offset takes earliest, latest, ts:MILLIS or a number, not {spec!r}"
        )


def _show(args: argparse.Namespace, partition: int, record) -> str:
    parts = []
    if args.print_offset:
        parts.append(f"{partition}:{record.offset}")
    if args.print_timestamp:
        parts.append(str(record.timestamp))
    if args.print_key:
        parts.append("" if record.key is None else record.key.decode("utf-8", "replace"))
    if args.print_headers:
        parts.append(",".join(f"{k}={(v or b'').decode('utf-8', 'replace')}"
                              for k, v in record.headers))
    parts.append("" if record.value is None else record.value.decode("utf-8", "replace"))
    return "\t".join(parts)


def _consume(args: argparse.Namespace) -> int:
    shown = 0
    with _admin(args) as admin:
        info = admin.metadata([args.topic]).topics[args.topic]
    indexes = [args.partition] if args.partition is not None else \
        [p.index for p in info.partitions]
    with Consumer(client_config(args, **{"client.id": "oncelog-consume"})) as consumer:
        partitions = [TopicPartition(args.topic, i) for i in indexes]
        consumer.assign(partitions)
        for tp in partitions:
            _seek_to(consumer, tp, args.offset)
        records = iter(consumer) if args.exit_at_end else _forever(consumer)
        for record in records:
            print(_show(args, record.partition, record), flush=False)
            shown += 1
            if args.max_messages and shown >= args.max_messages:
                break
        sys.stdout.flush()
    return 0


def _forever(consumer: Consumer):
    while True:
        yield from consumer.poll(timeout=1.0)
        sys.stdout.flush()


# --- audit ------------------------------------------------------------------------------------

def _audit(args: argparse.Namespace) -> int:
    import json

    from ..audit import AuditError, audit_topic, format_report

    if args.examples < 0 or args.fetch_max_bytes < 1024:
        print("oncelog audit: --examples must be 0 or more and --fetch-max-bytes 1024 or more",
              file=sys.stderr)
        return 2
    progress = None
    if not args.json and sys.stderr.isatty():
        last = [0.0]

        def progress(done: int, expected: int) -> None:
            now = time.monotonic()
            if now - last[0] >= 1.0:
                last[0] = now
                print(f"\r{done:,} of {expected:,} records read", end="", file=sys.stderr,
                      flush=True)

    if args.min_partitions is not None and args.min_partitions < 1:
        print("oncelog audit: --min-partitions must be 1 or more", file=sys.stderr)
        return 2
    try:
        if args.spark:
            try:
                from ..spark.audit import audit_in_new_session
            except ImportError as exc:  # no pyspark, or one the Spark code cannot run on
                print(f"oncelog audit --spark: {exc}", file=sys.stderr)
                return 2
            report = audit_in_new_session(args.bootstrap_server, args.topic, args.partition,
                                          args.spark_master, args.min_partitions,
                                          args.by or (), args.examples)
        else:
            report = audit_topic(args.bootstrap_server, args.topic, by=args.by or (),
                                 partitions=args.partition, examples=args.examples,
                                 directory=args.tmp_dir, max_bytes=args.fetch_max_bytes,
                                 progress=progress)
    except AuditError as exc:
        print(f"oncelog audit: {exc}", file=sys.stderr)
        return 2
    finally:
        if progress is not None:
            print("\r\033[K", end="", file=sys.stderr, flush=True)
    if args.json:
        json.dump(report.to_json(), sys.stdout, indent=2)
        print()
    else:
        format_report(report)
    return 0 if report.clean else 1


_AUDIT_HELP = """\
Read a topic from its log start to its high watermark (as of the start) and check, per
partition and idempotent producer id, that no sequence number was stored twice (duplicates,
per producer id and epoch), skipped (gaps) or went backwards (regressions; also batches of an
epoch older than one already seen). A new epoch restarts sequences (KIP-360). Works against
any Kafka-compatible broker: it uses only Metadata, ListOffsets and Fetch, on each partition's
leader, and keeps memory bounded (ranges of sequences, not records).

Transactions: each partition holding transactional batches is read with its markers, each
batch taking the decision (COMMIT, ABORT, none yet: open) of its producer's next marker on the
partition, and again as a read_committed reader (isolation_level 1, up to the last stable
offset, dropping the aborted transactions the broker lists). Reported: aborted or open
records read_committed sees, committed records it does not see, and transactions committed on
one partition and aborted on another (torn; how a transaction is recognised across partitions
is in oncelog/audit/transactions.py).

--by value (or key) also counts records whose value (key) occurs more than once anywhere in
the topic: the duplicates a non-idempotent producer, an application resending, or a producer
retrying under a new epoch leaves (sequence numbers cannot show those). Null values (keys) are
not counted. Each record costs 16 bytes in temporary files (--tmp-dir), not memory: values are
compared by an 8-byte BLAKE2b hash, so two different values could in principle be taken for
one (odds about n^2/2^65: under 1e-5 for ten million values); the examples shown are read back
and compared byte for byte.

--spark runs the audit as a Spark job (pip install 'oncelog[spark]' and a Java runtime):
tasks read offset ranges of the partitions in parallel (--min-partitions cuts big
partitions), keeping batch headers, markers and, for --by, 16 bytes a record; each partition
(and each hash, for --by) is then audited exactly as without --spark, with the same report.
--spark-master picks the cluster (default local[*]).

Exit status: 0 clean, 1 something is wrong (or the broker failed us), 2 usage errors such as
an unknown topic or partition."""

# --- wiring -----------------------------------------------------------------------------------

def _with_bootstrap(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    parser.add_argument("--bootstrap-server", default=DEFAULT_BOOTSTRAP, metavar="HOST:PORT",
                        help=f"broker to talk to (default {DEFAULT_BOOTSTRAP})")
    parser.add_argument("--command-config", metavar="FILE",
                        help="client settings (.properties: security.protocol, sasl.*, ssl.*; "
                             "Kafka's Java names too), as Kafka's tools take them")
    return parser


def _guarded(func):
    from .errors import guarded  # one way to stop on an error for every command

    return guarded(func)


def add_tool_commands(sub) -> None:
    from .cluster import add_cluster_commands
    from .groups import add_group_commands
    from .records import add_records_commands, add_topics_alter
    from .transactions import add_transaction_commands

    topics = sub.add_parser("topics", help="create, list, describe and delete topics",
                            description="Manage topics on any Kafka-compatible broker.")
    tsub = topics.add_subparsers(dest="topics_command", required=True, metavar="ACTION")

    create = _with_bootstrap(tsub.add_parser("create", help="create a topic"))
    create.add_argument("--topic", required=True)
    create.add_argument("--partitions", type=int, default=-1,
                        help="number of partitions (default: the broker's num.partitions)")
    create.add_argument("--replication-factor", type=int, default=-1)
    create.add_argument("--config", action="append", metavar="KEY=VALUE",
                        help="topic config such as retention.ms=60000; may be repeated")
    create.set_defaults(func=_guarded(_topics_create))

    listing = _with_bootstrap(tsub.add_parser("list", help="list topic names"))
    listing.set_defaults(func=_guarded(_topics_list))

    describe = _with_bootstrap(tsub.add_parser(
        "describe", help="partitions, leaders, offsets and config overrides of a topic"))
    describe.add_argument("--topic", required=True)
    describe.set_defaults(func=_guarded(_topics_describe))

    delete = _with_bootstrap(tsub.add_parser("delete", help="delete a topic and its data"))
    delete.add_argument("--topic", required=True)
    delete.set_defaults(func=_guarded(_topics_delete))

    add_topics_alter(tsub, _with_bootstrap, _guarded)

    producers = sub.add_parser("producers", help="idempotent producers a topic remembers",
                               description="Inspect the producer state of partitions.")
    psub = producers.add_subparsers(dest="producers_command", required=True, metavar="ACTION")
    pdescribe = _with_bootstrap(psub.add_parser(
        "describe", help="each producer id, epoch, last sequence and last timestamp"))
    pdescribe.add_argument("--topic", required=True)
    pdescribe.add_argument("--partition", type=int, help="only this partition (default: all)")
    pdescribe.set_defaults(func=_guarded(_producers_describe))

    stats = _with_bootstrap(sub.add_parser(
        "stats", help="produce outcomes per partition (appended, duplicate, each error)",
        description="Read an oncelog broker's counters from its metrics listener "
                    "(metrics.listener, Prometheus text at http://HOST:PORT/metrics)."))
    stats.add_argument("--metrics-server", required=True, metavar="HOST:PORT",
                       help="the broker's metrics.listener")
    stats.set_defaults(func=_guarded(_stats))

    produce = _with_bootstrap(sub.add_parser(
        "produce", help="send each line of standard input as a record",
        description="Send each line of standard input as one record."))
    produce.add_argument("--topic", required=True)
    produce.add_argument("--partition", type=int,
                         help="partition to write to (default: by key, else sticky)")
    produce.add_argument("--key-separator", metavar="SEP",
                         help="split each line at the first SEP into key and value")
    produce.add_argument("--header", action="append", metavar="KEY=VALUE",
                         help="header added to every record; may be repeated")
    produce.add_argument("--compression", choices=sorted(CODECS), default="none")
    produce.add_argument("--acks", choices=["all", "-1", "1", "0"], default="all")
    produce.add_argument("--batch-size", type=int, default=500, metavar="N",
                         help="records per batch at most (batch.num.messages, default 500)")
    produce.add_argument("--producer-property", action="append", metavar="KEY=VALUE",
                         help="any oncelog.Producer setting (Kafka names, e.g. linger.ms=50 "
                         "or enable.idempotence=false); may be repeated")
    produce.set_defaults(func=_guarded(_produce))

    consume = _with_bootstrap(sub.add_parser(
        "consume", help="print records of a topic",
        description="Print a topic's records, one per line (value last, tab-separated)."))
    consume.add_argument("--topic", required=True)
    consume.add_argument("--partition", type=int, help="only this partition (default: all)")
    consume.add_argument("--offset", default="earliest",
                         help="earliest (default), latest, ts:MILLIS, or an offset")
    consume.add_argument("--max-messages", type=int, default=0, metavar="N",
                         help="stop after N records")
    consume.add_argument("--exit-at-end", action="store_true",
                         help="stop at the end of the log instead of waiting for more")
    for flag in ("key", "offset", "timestamp", "headers"):
        consume.add_argument(f"--print-{flag}", action="store_true", help=f"show the {flag}")
    consume.set_defaults(func=_guarded(_consume))

    audit = _with_bootstrap(sub.add_parser(
        "audit", help="check a topic for duplicate, missing and reordered records, and its "
                      "transactions",
        description=_AUDIT_HELP, formatter_class=argparse.RawDescriptionHelpFormatter))
    audit.add_argument("--topic", required=True)
    audit.add_argument("--partition", type=int, action="append",
                       help="only this partition; may be repeated (default: all)")
    audit.add_argument("--by", choices=["key", "value"], action="append",
                       help="also find records whose key or value occurs more than once; "
                            "may be given twice")
    audit.add_argument("--json", action="store_true", help="print the report as JSON")
    audit.add_argument("--examples", type=int, default=5, metavar="N",
                       help="repeated keys or values to show (default 5)")
    audit.add_argument("--tmp-dir", metavar="DIR",
                       help="where --by keeps its hash files (default: the system's)")
    audit.add_argument("--fetch-max-bytes", type=int, default=8 << 20, metavar="BYTES",
                       help="bytes per fetch (default 8 MiB)")
    audit.add_argument("--spark", action="store_true",
                       help="run the audit on Spark (for topics too big for one process)")
    audit.add_argument("--spark-master", default="local[*]", metavar="URL",
                       help="Spark master for --spark (default local[*])")
    audit.add_argument("--min-partitions", type=int, metavar="N",
                       help="with --spark: read in at least N tasks (default: Spark's "
                            "default parallelism)")
    audit.set_defaults(func=_guarded(_audit))

    add_cluster_commands(sub, _with_bootstrap, _guarded)
    add_group_commands(sub, _with_bootstrap)
    add_transaction_commands(sub, _with_bootstrap)
    add_records_commands(sub, _with_bootstrap, _guarded)
