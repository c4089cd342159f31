#!/usr/bin/env python3
"""A TCP forwarder on 127.0.0.1 that delays every chunk by D ms in each direction, order kept:
network latency for a metadata server that runs on loopback (which has none).

    bench/delayproxy.py --target HOST:PORT --delay-ms D [--port P] [--stats FILE] [--log FILE]

Prints "listening PORT" (P, or the port the kernel chose when P is 0) once bound, then serves
until SIGTERM/SIGINT. bench/run puts one in front of every networked metadata server (the
Elasticsearch test double or OpenSearch for esfs, Redis for JuiceFS) with --latency-ms D.

Each accepted connection gets its own upstream connection and, per direction, a reader thread
(recv, stamp the arrival time, enqueue) and a writer thread (dequeue, sleep until stamp + D,
sendall). Chunks leave in arrival order, each D after it arrived; reading goes on while earlier
chunks wait, so a stream pays D once and not once per chunk, and connections never wait for
each other (no shared lock or queue). A request/response round trip gains 2*D. Threads rather
than asyncio: the event loop's epoll timeout has 1 ms granularity, too coarse for D = 0.5.
TCP_NODELAY on both sides, so Nagle adds nothing of its own.

Round trips: a connection's exchange starts when the client sends after the server has answered
(or for the first time). For a request/response protocol without pipelining (HTTP/1.1 keep-alive;
Redis without pipelines; a Lua script or a MULTI block is one) that is one request, the unit
latency is paid in. On SIGUSR1 the total so far is written to --stats FILE (replaced atomically). Connection set-up is not delayed
(both esfs's HTTP client and JuiceFS's Redis client keep their connections open).
--log FILE appends each exchange's first line (an HTTP request line), with the time: which
requests a workload sends.
"""
import argparse, collections, os, signal, socket, sys, threading, time

EXCHANGES = [0]
LOG = [None]


def pump(src, dst, delay, done, turn, me):
    """src -> dst, each chunk delayed by `delay` seconds; EOF is forwarded (after the delay) as
    a half-close. done(error) is called once this direction has finished."""
    q = collections.deque()
    cv = threading.Condition()

    def reader():
        try:
            while True:
                data = src.recv(262144)
                if data and turn[0] != me:
                    turn[0] = me
                    if me == "c":
                        EXCHANGES[0] += 1  # under the GIL; an off-by-one now and then is no matter
                        if LOG[0]:
                            LOG[0].write("%.3f %s\n" % (time.time(), data.split(b"\r\n", 1)[0][:200].decode("latin-1")))
                with cv:
                    q.append((time.monotonic() + delay, data))
                    cv.notify()
                if not data:
                    return
        except OSError:
            with cv:
                q.append((time.monotonic(), None))  # error: stop at once
                cv.notify()

    def writer():
        error = True
        try:
            while True:
                with cv:
                    while not q:
                        cv.wait()
                    due, data = q.popleft()
                if data is None:
                    break
                wait = due - time.monotonic()
                if wait > 0:
                    time.sleep(wait)
                if not data:  # EOF from src
                    dst.shutdown(socket.SHUT_WR)
                    error = False
                    break
                dst.sendall(data)
        except OSError:
            pass
        finally:
            done(error)

    for fn in (reader, writer):
        threading.Thread(target=fn, daemon=True).start()


def serve(client, target, delay):
    try:
        upstream = socket.create_connection(target)
    except OSError as e:
        print("upstream %s:%d: %s" % (target[0], target[1], e), file=sys.stderr, flush=True)
        client.close()
        return
    for s in (client, upstream):
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    left = [2]
    lock = threading.Lock()

    def done(error):
        with lock:
            left[0] -= 1
            last = left[0] == 0
        if last:
            client.close()
            upstream.close()
        elif error:  # a broken direction: wake the other's reader so that it ends too
            for s in (client, upstream):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
    turn = [None]  # who sent last: "c" (client) or "s" (server)
    pump(client, upstream, delay, done, turn, "c")
    pump(upstream, client, delay, done, turn, "s")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", required=True, help="HOST:PORT of the server")
    ap.add_argument("--delay-ms", type=float, required=True, help="one-way delay, each direction")
    ap.add_argument("--port", type=int, default=0, help="port to listen on (default: any free one)")
    ap.add_argument("--stats", help="file the exchange count is written to on SIGUSR1")
    ap.add_argument("--log", help="file each exchange's first line is appended to")
    o = ap.parse_args()
    if o.log:
        LOG[0] = open(o.log, "a", buffering=1)
    host, port = o.target.rsplit(":", 1)
    target, delay = (host, int(port)), o.delay_ms / 1e3
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))

    def stats(*_):
        if o.stats:
            with open(o.stats + ".tmp", "w") as f:
                f.write("%d\n" % EXCHANGES[0])
            os.rename(o.stats + ".tmp", o.stats)
    signal.signal(signal.SIGUSR1, stats)
    ls = socket.socket()
    ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.bind(("127.0.0.1", o.port))
    ls.listen(128)
    print("listening %d" % ls.getsockname()[1], flush=True)
    while True:
        c, _ = ls.accept()
        threading.Thread(target=serve, args=(c, target, delay), daemon=True).start()


if __name__ == "__main__":
    main()
