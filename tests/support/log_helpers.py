"""What tests besides tests/log/test_log.py use of it."""
import time

from oncelog.log.log import Log
from oncelog.protocol.record_batch import assign_offsets, split_batches
from oncelog.protocol.records import decode_batch, encode_batch

NOW = int(time.time() * 1000)


def append(log: Log, values: list[bytes], timestamp: int = NOW) -> tuple[int, int]:
    """Append as the partition does: roll first when the log says so."""
    batch = encode_batch([(None, v, (), timestamp) for v in values])
    headers = split_batches(batch, 1 << 30)
    if log.should_roll(headers, int(time.time() * 1000)):
        log.roll()
    headers, parts = assign_offsets(batch, headers, log.log_end_offset, 0)
    log.append(parts, headers)
    return headers[0].base_offset, headers[-1].last_offset


def read_values(log: Log, offset: int = 0) -> list[bytes]:
    values = []
    while offset < log.log_end_offset:
        data = log.read(offset, 1 << 20).records
        assert data, f"nothing read at {offset}"
        pos = 0
        while pos < len(data):
            header, records = decode_batch(data, pos)
            values += [r.value for r in records if r.offset >= offset]
            pos += header.size
        offset = header.last_offset + 1
    return values
