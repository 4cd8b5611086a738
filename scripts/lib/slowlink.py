#!/usr/bin/env python3
"""A TCP relay that paces what it forwards to a fixed rate: a registry on loopback seen through
a link of MBIT megabits per second (each direction its own link, shared by every connection),
for benchmarks whose figures depend on the network (scripts/bench-fleet.sh, SLOW_MBIT).

    slowlink.py LISTEN_PORT TARGET_HOST:TARGET_PORT MBIT

Prints "ready" once it listens. Pacing is a virtual clock per direction: every piece forwarded
moves the clock by its size / rate, and the relay sleeps until the clock is at most 5 ms ahead
of real time (so bursts stay within 5 ms of the link's capacity).
"""

import socket
import sys
import threading
import time

PIECE = 256 << 10
BURST_S = 0.005


class Link:
    def __init__(self, bytes_per_s):
        self.rate = bytes_per_s
        self.clock = time.monotonic()
        self.lock = threading.Lock()

    def pace(self, n):
        with self.lock:
            now = time.monotonic()
            self.clock = max(self.clock, now) + n / self.rate
            wait = self.clock - now - BURST_S
        if wait > 0:
            time.sleep(wait)


def pump(src, dst, link):
    try:
        while True:
            data = src.recv(PIECE)
            if not data:
                break
            link.pace(len(data))
            dst.sendall(data)
    except OSError:
        pass
    finally:
        for s, how in ((dst, socket.SHUT_WR), (src, socket.SHUT_RD)):
            try:
                s.shutdown(how)
            except OSError:
                pass


def serve(conn, target, down, up):
    try:
        upstream = socket.create_connection(target)
    except OSError:
        conn.close()
        return
    for s in (conn, upstream):
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    a = threading.Thread(target=pump, args=(conn, upstream, up), daemon=True)
    b = threading.Thread(target=pump, args=(upstream, conn, down), daemon=True)
    a.start()
    b.start()
    a.join()
    b.join()
    conn.close()
    upstream.close()


def main():
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    port = int(sys.argv[1])
    host, tport = sys.argv[2].rsplit(":", 1)
    rate = float(sys.argv[3]) * 1e6 / 8
    down, up = Link(rate), Link(rate)
    lsock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    lsock.bind(("127.0.0.1", port))
    lsock.listen(64)
    print("ready", flush=True)
    while True:
        conn, _ = lsock.accept()
        threading.Thread(
            target=serve, args=(conn, (host, int(tport)), down, up), daemon=True
        ).start()


if __name__ == "__main__":
    main()
