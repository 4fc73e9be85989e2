"""kiln from Python, step by step (run it after `kiln up`, with KILN_API and
KILN_KEY set, e.g. `. ~/.config/kiln/credentials` or the file kiln up wrote):

    PYTHONPATH=sdk/python /usr/bin/python3 examples/python_sdk.py
"""
import kiln

# A client from KILN_API and KILN_KEY.
client = kiln.Client()

# --- 1. Run code and get its result -----------------------------------------
r = client.run("print(sum(range(10)))")
print("1. stdout:", r.stdout.strip(), "| exit code:", r.exit_code, "| took", r.timings.get("total_ms"), "ms")

# --- 2. Files in, files out --------------------------------------------------
# Anything the code writes under /output comes back as a downloadable output.
r = client.run(
    "import csv\n"
    "rows = list(csv.reader(open('/work/data.csv')))\n"
    "open('/output/report.txt', 'w').write(f'{len(rows)} rows\\n')\n",
    files={"/work/data.csv": "a,b\n1,2\n3,4\n"},
)
print("2. outputs:", [o.path for o in r.outputs], "->", r.output("report.txt").read().decode().strip())

# --- 3. Failures are exceptions that carry the result ------------------------
try:
    client.run("raise ValueError('bad input')")
except kiln.TaskFailed as e:
    print("3. failed as expected:", e.result.end_reason, "| last line of stderr:", e.result.stderr.strip().splitlines()[-1])

# --- 4. Watch a longer task live ---------------------------------------------
task = client.submit("import time\nfor i in range(3):\n    print('step', i)\n    time.sleep(0.3)")
for event in task.stream():
    print("4. live:", event.type, event.data.strip())
print("4. final state:", task.wait().state)

# --- 5. A session keeps state between commands, and can pause ----------------
with client.session() as s:
    s.write("/work/counter.txt", "1")
    s.exec(code="n = int(open('/work/counter.txt').read()); open('/work/counter.txt', 'w').write(str(n + 1))")
    s.pause()    # memory and disk to S3, the VM is gone
    s.resume()   # back, on any host with room
    print("5. counter after pause/resume:", s.read("/work/counter.txt").decode())
# leaving the `with` destroyed the session

print("done")
