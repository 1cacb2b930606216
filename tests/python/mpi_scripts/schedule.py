"""Run under mpirun -np 2: rank 1 lists a different second entry; check_schedule must raise on
both ranks, naming each rank's entry. Prints "RESULT <type>: <message>"."""
import kiln
import kiln.distributed as dist

dist.init(timeout=20)
entries = [("fc1.weight", (16, 8), "float32"), ("fc1.bias", (16,), "float32"),
           ("fc2.weight", (4, 16), "float32")]
if dist.rank() == 1:
    entries[1] = ("fc1.bias", (17,), "float32")
dist.check_schedule(entries[:1])  # agreeing prefixes pass
try:
    dist.check_schedule(entries)
    print("RESULT no error", flush=True)
except dist.DistributedError as e:
    print(f"RESULT {type(e).__name__}: {e}".replace("\n", " | "), flush=True)
# Still usable afterwards: the mismatch was found before any reduction.
dist.barrier()
