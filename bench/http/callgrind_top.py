#!/usr/bin/env python3
"""Where a variant's instructions go, per request, from callgrind.sh's dumps.

Reads callgrind output files (one per variant: a phase dump, `callgrind.out.1` for fresh
keys or `.2` for replays), folds every function's cost over the source files its inlined
code came from, and prints per request (the dump's total / --requests):

  * self Ir of each function, and its difference from the baseline dump (--base, usually
    bare), largest differences first: where the extra instructions are executed;
  * inclusive Ir and calls per request of the functions matching --match (default: the
    engine's and the stores' functions, plus allocation, SHA-256, tracing and metrics):
    what each piece costs with everything it calls.

Functions are machine-code symbols: code inlined into a function counts as its. A
function that recurses (`name'2`) is folded into `name`; its inclusive cost is counted
once.

With --callers REGEX it lists instead who calls the matching functions (say `^malloc$`
or `memcpy`), largest growth over the base first.

With --sum REGEX it prints the total self Ir of the matching functions (callgrind.sh
takes SHA-256's block function out of its second table this way).

usage: callgrind_top.py --requests N [--base BASE_DUMP] [--top K] [--match REGEX]
                        [--callers REGEX] [--sum REGEX] DUMP
"""

import argparse
import collections
import re
import sys

DEFAULT_MATCH = (
    r"idempotent_runtime::|sha2::|tracing|metrics::|__rust_alloc$|__rust_dealloc$|"
    r"__rust_realloc$|^malloc$|^free$|^realloc$|memcpy|memmove|rand::|getrandom|"
    r"hashbrown|tokio::time|tokio::runtime::task::spawn|clock_gettime|Instant::now"
)


# Categories of the self-cost difference, first match wins.
CATEGORIES = [
    ("SHA-256 block function", r"^sha2::"),
    ("malloc / free", r"malloc|free|_int_|unlink_chunk|__rust_(alloc|dealloc|realloc)|__rdl_|"
     r"tcache|arena|sysmalloc|alloc_zeroed"),
    ("memcpy / memmove / memset / memcmp", r"^__mem|memcpy|memmove|memset|memcmp"),
    ("hashing (SipHash, hashbrown)", r"sip::|hash_one|hashbrown|BuildHasher|Hash>::hash"),
    ("clock reads", r"clock_gettime|Timespec|Instant|SystemTime|now_millis"),
    ("tracing", r"^<?tracing|tracing::|tracing_core"),
    ("metrics", r"idempotent_runtime::metrics"),
    ("the engine (idempotent_runtime::engine)", r"idempotent_runtime::engine"),
    ("the store (idempotent_runtime::store)", r"idempotent_runtime::store"),
    ("fingerprint, key, request, macro support", r"idempotent_runtime::"),
    ("handler wrappers (macro expansion, axum)", r"axum::handler::Handler|create_order"),
    ("tokio", r"tokio::"),
    ("SQLite", r"^sqlite3|^wal|^vdbe|^pcache|^btree|^unix|^pager|^sqlite"),
    ("pthread", r"pthread"),
]


def base_name(name):
    """`f'2` (a recursion level) -> `f`."""
    return re.sub(r"'\d+$", "", name)


def parse(path, event="Ir"):
    """Self cost, inclusive cost and calls received per function (base names), and
    totals, of one event (Ir unless told; with --cache-sim=yes also D1mr, DLmw, ...)."""
    self_ir = collections.Counter()
    incl_calls = collections.Counter()  # cost of calls to other functions, by caller
    calls_in = collections.Counter()
    edges = collections.Counter()  # (caller, callee) -> [calls, inclusive Ir]
    edge_calls = collections.Counter()
    names = {"fn": {}}
    totals = None
    fn = None
    cfn = None
    pending_call = None  # count of the call whose cost line comes next
    column = 1

    def resolve(value):
        match = re.match(r"\((\d+)\)(?:\s+(.*))?$", value)
        if not match:
            return value
        ident, name = match.groups()
        if name is not None:
            names["fn"][ident] = name
            return name
        return names["fn"][ident]

    with open(path, encoding="utf-8", errors="replace") as dump:
        for line in dump:
            line = line.rstrip("\n")
            if not line:
                continue
            first = line[0]
            if first.isdigit() or first in "+-*":
                parts = line.split()
                cost = int(parts[column]) if len(parts) > column else 0
                if pending_call is not None:
                    count = pending_call
                    pending_call = None
                    calls_in[base_name(cfn)] += count
                    edges[(base_name(fn), base_name(cfn))] += cost
                    edge_calls[(base_name(fn), base_name(cfn))] += count
                    if base_name(cfn) != base_name(fn):
                        incl_calls[base_name(fn)] += cost
                else:
                    self_ir[base_name(fn)] += cost
                continue
            key, _, value = line.partition("=")
            if key == "fn":
                fn = resolve(value)
            elif key == "cfn":
                cfn = resolve(value)
            elif key == "calls":
                pending_call = int(value.split()[0])
            elif line.startswith("events:"):
                events = line.split()[1:]
                if event not in events:
                    sys.exit(f"{path}: no event {event} (events: {' '.join(events)})")
                column = 1 + events.index(event)
            elif line.startswith("totals:"):
                totals = int(line.split()[column])
    inclusive = collections.Counter()
    for name in set(self_ir) | set(incl_calls):
        inclusive[name] = self_ir[name] + incl_calls[name]
    return self_ir, inclusive, calls_in, totals, edges, edge_calls


def short(name, width=110):
    name = re.sub(r"idempotent_runtime::", "ir::", name)
    return name if len(name) <= width else name[: width - 1] + "…"


def main():
    parser = argparse.ArgumentParser(
        description="Per-request Ir by function from callgrind.sh's dumps."
    )
    parser.add_argument("dump", help="the variant's dump (callgrind.out.1 or .2)")
    parser.add_argument("--base", help="the baseline dump (bare's, same phase)")
    parser.add_argument("--requests", type=int, default=1, help="requests in the dump")
    parser.add_argument("--top", type=int, default=40, help="rows per table (default 40)")
    parser.add_argument("--match", default=DEFAULT_MATCH, help="regex for the inclusive table")
    parser.add_argument("--event", default="Ir", help="the event to count (default Ir; "
                        "with --cache-sim=yes also I1mr, D1mr, D1mw, ILmr, DLmr, DLmw)")
    parser.add_argument("--sum", metavar="REGEX", help="print only the total self Ir (not "
                        "per request) of the functions matching REGEX, and exit")
    parser.add_argument("--callers", help="regex: list the callers of the matching functions "
                        "(Ir of the calls and calls per request), against the base too")
    args = parser.parse_args()
    n = args.requests

    self_ir, inclusive, calls_in, totals, edges, edge_calls = parse(args.dump, args.event)
    if args.sum:
        pattern = re.compile(args.sum)
        print(sum(cost for name, cost in self_ir.items() if pattern.search(name)))
        return 0
    print(f"{args.dump}: {totals / n:,.0f} {args.event} per request")
    if args.base:
        base_self, _, base_calls, base_totals, base_edges, base_edge_calls = parse(args.base, args.event)
        print(f"{args.base}: {base_totals / n:,.0f} {args.event} per request; "
              f"difference {(totals - base_totals) / n:,.0f}")
        print(f"\nself {args.event} per request, largest differences from the base first")
        print(f"{'variant':>9} {'base':>9} {'diff':>9} {'calls±':>7}  function")
        diffs = []
        for name in set(self_ir) | set(base_self):
            diffs.append((self_ir[name] - base_self[name], name))
        diffs.sort(reverse=True)
        for diff, name in diffs[: args.top]:
            dcalls = (calls_in[name] - base_calls[name]) / n
            print(f"{self_ir[name] / n:9.0f} {base_self[name] / n:9.0f} {diff / n:9.0f} "
                  f"{dcalls:7.2f}  {short(name)}")
        print("\nthe difference by category (self Ir per request, first match wins)")
        by_category = collections.Counter()
        for diff, name in diffs:
            label = next((label for label, rx in CATEGORIES if re.search(rx, name)), "other")
            by_category[label] += diff
        for label, diff in by_category.most_common():
            print(f"{diff / n:9.0f}  {label}")
        print("\nlargest savings (negative differences):")
        for diff, name in sorted(diffs)[:5]:
            print(f"{self_ir[name] / n:9.0f} {base_self[name] / n:9.0f} {diff / n:9.0f}  "
                  f"{short(name)}")
    if args.callers:
        callee = re.compile(args.callers)
        print(f"\ncallers of functions matching {args.callers!r}: inclusive Ir and calls "
              "per request" + (", then the base's" if args.base else ""))
        keys = {k for k in edges if callee.search(k[1])}
        if args.base:
            keys |= {k for k in base_edges if callee.search(k[1])}
        rows = []
        for key in keys:
            base_ir = base_edges[key] if args.base else 0
            rows.append((edges[key] - base_ir, key))
        rows.sort(reverse=True)
        for _, key in rows[: args.top]:
            line = f"{edges[key] / n:8.0f} {edge_calls[key] / n:6.2f}"
            if args.base:
                line += f" {base_edges[key] / n:8.0f} {base_edge_calls[key] / n:6.2f}"
            print(f"{line}  {short(key[0], 90)} -> {short(key[1], 40)}")
        return 0
    pattern = re.compile(args.match)
    print(f"\ninclusive Ir and calls per request of functions matching {args.match!r}")
    print(f"{'incl':>9} {'self':>8} {'calls':>6}  function")
    rows = [(inclusive[name], name) for name in inclusive if pattern.search(name)]
    rows.sort(reverse=True)
    for incl, name in rows[: args.top]:
        print(f"{incl / n:9.0f} {self_ir[name] / n:8.0f} {calls_in[name] / n:6.2f}  {short(name)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
