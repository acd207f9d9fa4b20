"""The torch.distributed sidecar of one slm-train rank (lib/distributed/group.ts starts it).

Why a sidecar: Debian's libtorch-dev ships no c10d headers, so the native addon cannot call
ProcessGroupGloo/NCCL itself; Debian's python3-torch (the same libtorch build) exposes them through
torch.distributed. Each training rank (a Node process) runs one of these; the sidecars form the
process group (rendezvous through a c10d TCPStore at MASTER_ADDR:MASTER_PORT, env://), and the
rank hands them tensors through a file in shared memory (/dev/shm) that both sides map.

Protocol: one JSON object per line on stdin, one JSON reply per line on stdout (logs on stderr).
  first reply: {"ok": true, "ready": true, "rank", "world", "backend"} once the group has formed
  {"op": "all_reduce", "file", "n"}            float32 [n] in the file, summed over ranks in place
  {"op": "broadcast", "file", "n", "src"}      float32 [n] in the file, rank src's copy everywhere
  {"op": "all_reduce_values", "values": [..]}  small float64 sums, returned in "values"
  {"op": "all_gather", "value": any}           every rank's JSON value, in rank order, in "values"
  {"op": "barrier"}
  {"op": "close"}                               leaves the group and exits 0
Any failure (a peer gone, a collective past the timeout) answers {"ok": false, "error"} and exits 1:
a broken process group cannot be used again.
"""
import argparse
import datetime
import json
import os
import sys
import time


def reply(obj):
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--backend", default="gloo", choices=["gloo", "nccl"])
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds for the rendezvous and every collective")
    ap.add_argument("--device", default="cpu", help="cpu, or cuda:N for NCCL")
    a = ap.parse_args()
    try:
        import torch
        import torch.distributed as dist
    except Exception as e:  # noqa: BLE001
        reply({"ok": False, "error": f"cannot import torch.distributed in {sys.executable}: {e}"})
        return 1
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    device = torch.device(a.device)
    try:
        if a.backend == "nccl":
            if not (torch.cuda.is_available() and dist.is_nccl_available()):
                raise RuntimeError(
                    f"the nccl backend needs a CUDA build of torch with NCCL; {sys.executable} has torch {torch.__version__} (cuda available: {torch.cuda.is_available()}). Point distributed.python at a CUDA torch, or use gloo"
                )
            torch.cuda.set_device(device)
        t0 = time.time()
        dist.init_process_group(a.backend, init_method="env://", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=a.timeout))
        # One collective so that "ready" means every rank is connected, not just registered.
        probe = torch.ones(1, device=device)
        dist.all_reduce(probe)
        if int(probe.item()) != world:
            raise RuntimeError(f"probe all-reduce gave {probe.item()}, expected {world}")
    except Exception as e:  # noqa: BLE001
        reply(
            {
                "ok": False,
                "error": f"rank {rank}: joining the process group ({a.backend}, {os.environ.get('MASTER_ADDR')}:{os.environ.get('MASTER_PORT')}, world {world}) failed: {e}",
            }
        )
        return 1
    reply({"ok": True, "ready": True, "rank": rank, "world": world, "backend": a.backend, "ms": (time.time() - t0) * 1e3})

    def mapped(msg):
        # The file is shared: from_file(shared=True) maps it, so in-place results land in the file.
        t = torch.from_file(msg["file"], shared=True, size=int(msg["n"]), dtype=torch.float32)
        return t, (t.to(device) if device.type != "cpu" else t)

    for line in sys.stdin:
        line = line.strip()
        if not line:
            continue
        msg = json.loads(line)
        op = msg.get("op")
        t0 = time.time()
        try:
            if op == "close":
                dist.destroy_process_group()
                reply({"ok": True})
                return 0
            if op == "all_reduce":
                host, t = mapped(msg)
                dist.all_reduce(t)
                if t is not host:
                    host.copy_(t.cpu())
                out = {}
            elif op == "broadcast":
                host, t = mapped(msg)
                dist.broadcast(t, src=int(msg.get("src", 0)))
                if t is not host:
                    host.copy_(t.cpu())
                out = {}
            elif op == "all_reduce_values":
                t = torch.tensor(msg["values"], dtype=torch.float64, device=device)
                dist.all_reduce(t)
                out = {"values": t.cpu().tolist()}
            elif op == "all_gather":
                got = [None] * world
                dist.all_gather_object(got, msg.get("value"))
                out = {"values": got}
            elif op == "barrier":
                dist.barrier()
                out = {}
            else:
                reply({"ok": False, "error": f"unknown op {op!r}"})
                continue
            reply({"ok": True, "ms": (time.time() - t0) * 1e3, **out})
        except Exception as e:  # noqa: BLE001
            reply({"ok": False, "error": f"rank {rank}: {op} failed after {time.time() - t0:.1f} s: {e}"})
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
