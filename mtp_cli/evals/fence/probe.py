"""What a fence lets through, run in it once by `sandbox.detect()`: whether a path outside the minimal
root is visible and whether the process can fork, written on fd 3 as a JSON string after the job's
nonce. Run as `python -I -S -c <this file's text>`; never imported."""
import json
import os
import sys

task = json.loads(sys.stdin.readline())
try:
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
    forked = True
except OSError:
    forked = False
found = json.dumps({"sees_outside": os.path.exists(task["outside"]), "forked": forked})
os.write(3, json.dumps(task["nonce"] + found).encode())  # a result is a JSON string
