#!/usr/bin/env python3
"""Issue-4 figures: what tree locking costs and how renames scale.

Mounts the release binary on a fresh embedded store (and, with --es, on the
Elasticsearch *test double* from `cargo run --example es_test_server`: that
row shows protocol overhead, not cluster speed) and measures, median of
--rounds runs:
  - creates/s in one directory, with tree locks and without
    (ESFS_BENCH_NO_TREE_LOCKS=1, a benchmark-only switch), hence the lock
    overhead per create;
  - directory rename of a directory holding 10k and 100k files;
  - concurrent renames: 4 threads renaming files in 4 directories.
Usage: bench/renames.py [--quick] [--es] [--rounds N]
Prints a Markdown table. Only processes it starts are stopped, by pid.
"""
import os, statistics, subprocess, sys, tempfile, threading, time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.join(ROOT, "target/release/esfs")


def mounted(mnt):
    with open("/proc/self/mountinfo") as f:
        return any(l.split()[4] == mnt for l in f)


class Mount:
    def __init__(self, backend_args, env=None):
        self.tmp = tempfile.mkdtemp(prefix="esfs-bench-")
        self.mnt = os.path.join(self.tmp, "mnt")
        os.mkdir(self.mnt)
        if not backend_args:
            backend_args = ["--store", self.tmp + "/store", "--data", self.tmp + "/data"]
        e = dict(os.environ, RUST_LOG="warn", **(env or {}))
        self.proc = subprocess.Popen([BIN, "mount", self.mnt, "--foreground", *backend_args],
                                     env=e, stderr=open(self.tmp + "/log", "w"))
        for _ in range(500):
            if mounted(self.mnt):
                return
            time.sleep(0.02)
        raise SystemExit("mount failed: " + open(self.tmp + "/log").read())

    def close(self):
        subprocess.run(["fusermount3", "-u", self.mnt])
        self.proc.wait(timeout=60)
        subprocess.run(["rm", "-rf", self.tmp])


def creates(m, n):
    d = os.path.join(m.mnt, "c%d" % time.time_ns())
    os.mkdir(d)
    t = time.perf_counter()
    for i in range(n):
        os.close(os.open("%s/f%d" % (d, i), os.O_CREAT | os.O_WRONLY, 0o644))
    return n / (time.perf_counter() - t)


def dir_rename(m, n):
    d = os.path.join(m.mnt, "r%d" % n)
    os.makedirs(d + "/sub")
    for i in range(n):
        os.close(os.open("%s/sub/f%d" % (d, i), os.O_CREAT | os.O_WRONLY, 0o644))
    t = time.perf_counter()
    os.rename(d, d + "x")
    return time.perf_counter() - t


def concurrent_renames(m, secs=3.0, threads=4):
    count = [0] * threads
    stop = time.time() + secs

    def work(k):
        d = os.path.join(m.mnt, "t%d" % k)
        os.mkdir(d)
        open(d + "/a", "w").close()
        names = ["a", "b"]
        while time.time() < stop:
            os.rename("%s/%s" % (d, names[count[k] % 2]), "%s/%s" % (d, names[(count[k] + 1) % 2]))
            count[k] += 1

    ts = [threading.Thread(target=work, args=(k,)) for k in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return sum(count) / secs


def main():
    quick = "--quick" in sys.argv
    rounds = int(sys.argv[sys.argv.index("--rounds") + 1]) if "--rounds" in sys.argv else (1 if quick else 3)
    n_create, sizes = (500, [1000]) if quick else (10000, [10000, 100000])
    subprocess.run(["cargo", "build", "--release", "--quiet", "--examples", "--bins"], cwd=ROOT, check=True)
    backends = [("embedded", [])]
    server = None
    if "--es" in sys.argv:
        server = subprocess.Popen([os.path.join(ROOT, "target/release/examples/es_test_server"),
                                   "--listen", "127.0.0.1:19299"], stdout=subprocess.PIPE)
        server.stdout.readline()
        backends.append(("es test double", ["--es", "http://127.0.0.1:19299", "--index", "bench"]))
    rows = []
    try:
        for name, args in backends:
            res = {}
            for r in range(rounds):
                if name != "embedded":
                    args = ["--es", "http://127.0.0.1:19299", "--index", "bench%d" % r, "--no-delegate"]
                m = Mount(args)
                res.setdefault("creates/s (tree locks)", []).append(creates(m, n_create))
                for n in sizes:
                    res.setdefault("dir rename, %d files (s)" % n, []).append(dir_rename(m, n))
                res.setdefault("concurrent renames/s (4 threads)", []).append(concurrent_renames(m))
                m.close()
                if name != "embedded":
                    args = ["--es", "http://127.0.0.1:19299", "--index", "benchnl%d" % r, "--no-delegate"]
                m = Mount(args, env={"ESFS_BENCH_NO_TREE_LOCKS": "1"})
                res.setdefault("creates/s (no tree locks)", []).append(creates(m, n_create))
                m.close()
            med = {k: statistics.median(v) for k, v in res.items()}
            a, b = med["creates/s (tree locks)"], med["creates/s (no tree locks)"]
            med["lock overhead per create (us)"] = (1 / a - 1 / b) * 1e6
            rows.append((name, med))
    finally:
        if server:
            server.terminate()
            server.wait()
    keys = list(rows[0][1].keys())
    print("| figure | " + " | ".join(n for n, _ in rows) + " |")
    print("|---|" + "---|" * len(rows))
    for k in keys:
        print("| %s | %s |" % (k, " | ".join("%.3g" % r[k] for _, r in rows)))
    print("\n(median of %d round(s); %s)" % (rounds, time.strftime("%Y-%m-%d")))


if __name__ == "__main__":
    main()
