"""One DNS A query over UDP (RFC 1035), enough to ask the node's CoreDNS whether it answers
cluster names; no resolver library is a dependency of the tests."""

from __future__ import annotations

import secrets
import socket
import struct


def query_a(server: str, name: str, port: int = 53, timeout: float = 2) -> list[str]:
    """The IPv4 addresses `server` answers for `name` ([] for NXDOMAIN or no A records)."""
    ident = secrets.randbelow(1 << 16)
    question = b"".join(bytes([len(label)]) + label.encode() for label in name.rstrip(".").split(".")) + b"\0"
    packet = struct.pack("!HHHHHH", ident, 0x0100, 1, 0, 0, 0) + question + struct.pack("!HH", 1, 1)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.settimeout(timeout)
        sock.sendto(packet, (server, port))
        reply = sock.recv(4096)
    got_id, flags, _, answers, _, _ = struct.unpack("!HHHHHH", reply[:12])
    if got_id != ident:
        raise OSError(f"DNS reply id {got_id} != query id {ident}")
    if flags & 0xF not in (0, 3):  # NOERROR or NXDOMAIN; anything else is a failure to answer
        raise OSError(f"DNS {name} at {server}: rcode {flags & 0xF}")
    offset, addresses = 12 + len(question) + 4, []
    for _ in range(answers):
        # Each answer's name is a 2-byte compression pointer to the question here.
        offset = offset + 2 if reply[offset] & 0xC0 == 0xC0 else reply.index(b"\0", offset) + 1
        rtype, _, _, length = struct.unpack("!HHIH", reply[offset : offset + 10])
        offset += 10
        if rtype == 1 and length == 4:
            addresses.append(socket.inet_ntoa(reply[offset : offset + 4]))
        offset += length
    return addresses
