#!/usr/bin/env python3
"""Replays a list of requests against two Elasticsearch-like URLs and prints where the answers differ.

Usage: compare.py CASES_FILE URL_A URL_B [--ignore KEY ...] [--show]

Written to check the test double against a real Elasticsearch: the first URL is the reference.
Standard library only.

CASES_FILE holds blocks separated by blank lines. A block's first line is `METHOD /path?query`;
the lines after it (up to the blank line) are the body, sent as written with a final newline
(`application/x-ndjson` for paths with `_bulk` or `_msearch`, else `application/json`).
Lines starting with `#` are comments, except for two directives that may follow a request:
  #set NAME FIELD   keeps FIELD of this answer (dotted path) per server; `{{NAME}}` in later
                    requests is replaced by each server's own value (point-in-time ids)
  #quiet            do not compare this answer (setup and cleanup)
Values that cannot agree are left out of the comparison: `took`, and every key given with
--ignore (default: id, pit_id, _shards, cluster_uuid). Use index names of your own (`dbl-...`)
and delete them at the end of the file.
"""

import json
import sys
import urllib.error
import urllib.request

VOLATILE = {"took"}


def parse_cases(text):
    cases, block = [], []
    for line in text.split("\n") + [""]:
        if line.strip() == "":
            if block:
                cases.append(block)
            block = []
        elif line.startswith("#") and not line.startswith(("#set ", "#quiet")):
            continue
        else:
            block.append(line)
    out = []
    for block in cases:
        method, path = block[0].split(" ", 1)
        body = [l for l in block[1:] if not l.startswith("#")]
        sets = [l.split()[1:3] for l in block[1:] if l.startswith("#set ")]
        quiet = any(l.startswith("#quiet") for l in block[1:])
        out.append((method, path, "\n".join(body) + "\n" if body else None, sets, quiet))
    return out


def send(url, method, path, body):
    data = body.encode() if body is not None else None
    ctype = "application/x-ndjson" if ("_bulk" in path or "_msearch" in path) else "application/json"
    req = urllib.request.Request(url + path, data=data, method=method)
    if data is not None:
        req.add_header("Content-Type", ctype)
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            status, raw = r.status, r.read()
    except urllib.error.HTTPError as e:
        status, raw = e.code, e.read()
    try:
        return status, json.loads(raw) if raw else None
    except ValueError:
        return status, raw.decode(errors="replace")


def field(v, dotted):
    for part in dotted.split("."):
        v = v[int(part)] if isinstance(v, list) else (v or {}).get(part)
    return v


def diff(a, b, ignore, where=""):
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b)):
            if k in ignore or k in VOLATILE:
                continue
            p = f"{where}.{k}" if where else k
            if k not in a:
                yield f"{p}: only in B: {json.dumps(b[k])[:200]}"
            elif k not in b:
                yield f"{p}: only in A: {json.dumps(a[k])[:200]}"
            else:
                yield from diff(a[k], b[k], ignore, p)
    elif isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b)):
            yield from diff(x, y, ignore, f"{where}.{i}")
    elif a != b:
        yield f"{where or '(body)'}: A {json.dumps(a)[:300]} | B {json.dumps(b)[:300]}"


def main(argv):
    args, ignore, show = [], {"id", "pit_id", "_shards", "cluster_uuid"}, False
    it = iter(argv)
    for a in it:
        if a == "--ignore":
            ignore.add(next(it))
        elif a == "--show":
            show = True
        else:
            args.append(a)
    if len(args) != 3:
        sys.exit(__doc__)
    cases_file, url_a, url_b = args
    with open(cases_file) as f:
        cases = parse_cases(f.read())
    vars_ = {url_a: {}, url_b: {}}
    differing = 0
    for method, path, body, sets, quiet in cases:
        answers = []
        for url in (url_a, url_b):
            p, b = path, body
            for k, v in vars_[url].items():
                p = p.replace("{{%s}}" % k, str(v))
                b = b.replace("{{%s}}" % k, str(v)) if b else b
            status, resp = send(url, method, p, b)
            for name, dotted in sets:
                vars_[url][name] = field(resp, dotted)
            answers.append((status, resp))
        if quiet:
            continue
        (sa, ra), (sb, rb) = answers
        lines = ([f"status: A {sa} | B {sb}"] if sa != sb else []) + list(diff(ra, rb, ignore))
        mark = "DIFF" if lines else "same"
        differing += bool(lines)
        print(f"{mark} {method} {path}")
        for l in lines:
            print("    " + l)
        if show:
            print("    A: " + json.dumps(ra)[:600])
            print("    B: " + json.dumps(rb)[:600])
    print(f"{differing} of {sum(1 for c in cases if not c[4])} answers differ")
    return 1 if differing else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
