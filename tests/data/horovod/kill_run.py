"""Start horovodrun, wait until the timeline file on disk reaches a size,
then SIGKILL horovodrun and every descendant (the rank processes) at once."""
import os, signal, subprocess, sys, time, psutil
tl = sys.argv[1]; limit = int(sys.argv[2]); cmd = sys.argv[3:]
env = dict(os.environ, HOROVOD_TIMELINE=tl)
p = subprocess.Popen(cmd, env=env)
t0 = time.time()
while p.poll() is None:
    if os.path.exists(tl) and os.path.getsize(tl) >= limit:
        break
    time.sleep(0.05)
procs = [psutil.Process(p.pid)] + psutil.Process(p.pid).children(recursive=True)
print("killing after %.2fs, on-disk size %d, pids %s" % (time.time() - t0, os.path.getsize(tl),
      [(q.pid, q.name()) for q in procs]), flush=True)
for q in procs:
    try: os.kill(q.pid, signal.SIGKILL)
    except ProcessLookupError: pass
p.wait()
time.sleep(1)
print("rc", p.returncode, "alive after:", [q.pid for q in procs if q.is_running() and q.status() != psutil.STATUS_ZOMBIE])
