"""What a local-mode Delta Spark job pays before its first Delta commit, with the Delta and
S3A jars given the way the job gives them now vs as ``spark.jars`` (the job's way until
2026-11-28, and what ``spark-submit --jars`` still does).

In local mode the executor lives in the driver's JVM. With ``spark.jars`` it still fetches
every jar from the driver's file server into the application's temporary folder at its
first task: 671 MB (the AWS SDK bundle alone is 686 MB on disk) written on every run. The
job now puts the jars on the driver's class loader only (``merge.session.spark_session``).

Each round starts two fresh Python processes, one per way, alternated (order swapped every
round): session start, then one Delta write and one MERGE into a local folder; printed per
way: seconds to the session, seconds to the MERGE's end, bytes under the application's
``SparkFiles`` root, and the ratio of medians (ours / ``spark.jars``).

    .venv/bin/python bench/spark_start.py [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

_CHILD = r'''
import json, os, sys, tempfile, time
t0 = time.time()
from airflow_pgcdc.merge import jars
from airflow_pgcdc.merge.session import spark_session
conf = {"spark.jars": ",".join(jars.find_jars())} if sys.argv[1] == "spark.jars" else {}
spark = spark_session("local[2]", app_name="bench-spark-start", delta=True, conf=conf)
started = time.time() - t0
from pyspark import SparkFiles
d = tempfile.mkdtemp()
spark.range(1000).write.format("delta").save(d + "/t")
spark.sql(f"MERGE INTO delta.`{d}/t` t USING (SELECT id FROM range(500, 1500)) s ON t.id = s.id "
          "WHEN NOT MATCHED THEN INSERT *")
assert spark.read.format("delta").load(d + "/t").count() == 1500
done = time.time() - t0
root = SparkFiles.getRootDirectory()
copied = sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(root) for f in fs)
spark.stop()
print("RESULT " + json.dumps({"session_s": started, "merged_s": done, "copied_bytes": copied}))
'''

WAYS = ("class loader", "spark.jars")


def one(way: str) -> dict:
    env = dict(os.environ, SPARK_LOCAL_IP="127.0.0.1")
    proc = subprocess.run([sys.executable, "-c", _CHILD, way], env=env, capture_output=True, text=True,
                          timeout=900)
    if proc.returncode != 0:
        raise SystemExit(f"{way}: rc {proc.returncode}\n{proc.stderr[-3000:]}")
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT "))
    return json.loads(line[len("RESULT "):])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    from airflow_pgcdc.merge.jars import unavailable_reason

    missing = unavailable_reason()
    if missing:
        raise SystemExit(missing)
    runs: dict[str, list[dict]] = {w: [] for w in WAYS}
    for r in range(args.rounds):
        for way in (WAYS if r % 2 == 0 else WAYS[::-1]):
            got = one(way)
            runs[way].append(got)
            print(f"round {r + 1} {way:>12}: session {got['session_s']:5.1f} s, MERGE done "
                  f"{got['merged_s']:5.1f} s, copied {got['copied_bytes'] / 1e6:7.1f} MB", flush=True)
    med = {w: {k: statistics.median(x[k] for x in runs[w]) for k in runs[w][0]} for w in WAYS}
    for w in WAYS:
        print(f"median {w:>12}: session {med[w]['session_s']:5.1f} s, MERGE done {med[w]['merged_s']:5.1f} s, "
              f"copied {med[w]['copied_bytes'] / 1e6:7.1f} MB")
    ours, base = med["class loader"], med["spark.jars"]
    print(f"ratio class loader / spark.jars: to the MERGE's end {ours['merged_s'] / base['merged_s']:.2f}x, "
          f"bytes copied {ours['copied_bytes'] / max(base['copied_bytes'], 1):.3f}x")


if __name__ == "__main__":
    main()
