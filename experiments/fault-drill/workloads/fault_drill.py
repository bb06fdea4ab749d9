"""fault-drill workload: tiny data-parallel training with torch.distributed (gloo) on CPU.

Every rank trains the same small MLP on its own shard of a synthetic regression task, all-reducing gradients
each step. Rank 0 checkpoints every ``--ckpt-every`` steps (atomically). When a peer dies, the survivors'
collective fails (connection reset, or the process-group timeout), they log it and exit 75. Restarted with
``--from_checkpoint``, rank 0 loads its checkpoint and broadcasts weights and step, so the loss curve continues.
Each rank appends to ``train_log.csv`` (time,attempt,epoch,step,loss; step is the global step).
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys
import time

import torch
import torch.distributed as dist

PEER_LOST = 75


def route_ifname(addr: str) -> str | None:
    """The interface that reaches ``addr`` (so gloo does not pick the hostname's 127.0.1.1)."""
    import socket
    import subprocess

    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((addr, 9))
            local = s.getsockname()[0]
        out = subprocess.run(["ip", "-o", "-4", "addr", "show"], capture_output=True, text=True, check=False).stdout
    except OSError:
        return None
    for ln in out.splitlines():
        parts = ln.split()
        if len(parts) > 3 and parts[3].split("/")[0] == local:
            return parts[1]
    return None


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rank", type=int, required=True)
    ap.add_argument("--world-size", type=int, required=True)
    ap.add_argument("--master-addr", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=29500)
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--steps-per-epoch", type=int, default=10)
    ap.add_argument("--step-seconds", type=float, default=0.15)
    ap.add_argument("--ckpt-every", type=int, default=5)
    ap.add_argument("--timeout", type=float, default=6.0)
    ap.add_argument("--attempt", type=int, default=0)
    ap.add_argument("--from_checkpoint", action="store_true")
    ap.add_argument("--ckpt", default="ckpt.pt")
    a = ap.parse_args()
    torch.set_num_threads(1)
    if "GLOO_SOCKET_IFNAME" not in os.environ and (ifname := route_ifname(a.master_addr)):
        os.environ["GLOO_SOCKET_IFNAME"] = ifname
    # rendezvous (tcp://master:port) may wait long for slow starters; collectives time out after --timeout
    store = dist.TCPStore(a.master_addr, a.port, a.world_size, is_master=a.rank == 0,
                          timeout=datetime.timedelta(seconds=120))
    dist.init_process_group("gloo", store=store, rank=a.rank, world_size=a.world_size,
                            timeout=datetime.timedelta(seconds=a.timeout))
    torch.manual_seed(2021)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(100 + a.rank)
    w_true = torch.randn(16, 1, generator=torch.Generator().manual_seed(7))
    x = torch.randn(256, 16, generator=g)
    y = x @ w_true + 0.05 * torch.randn(256, 1, generator=g)

    step = torch.zeros(1, dtype=torch.long)
    if a.from_checkpoint and a.rank == 0 and not os.path.exists(a.ckpt):  # it lived on a host replaced since
        print(f"rank 0 found no checkpoint {a.ckpt}: starting again from step 0", flush=True)
    elif a.from_checkpoint and a.rank == 0:
        state = torch.load(a.ckpt)
        model.load_state_dict(state["model"])
        step[0] = state["step"]
        print(f"rank 0 restored checkpoint {a.ckpt} at step {state['step']}", flush=True)
    dist.broadcast(step, 0)
    for p in model.parameters():
        dist.broadcast(p.data, 0)
    total = a.epochs * a.steps_per_epoch
    new = not os.path.exists("train_log.csv")
    log = open("train_log.csv", "a", buffering=1)  # noqa: SIM115
    if new:
        log.write("time,attempt,epoch,step,loss\n")
    gstep = int(step[0])
    print(f"rank {a.rank} attempt {a.attempt} starts at step {gstep} of {total}", flush=True)
    try:
        while gstep < total:
            epoch = gstep // a.steps_per_epoch
            i = (gstep * 32) % 256
            loss = torch.nn.functional.mse_loss(model(x[i:i + 32]), y[i:i + 32])
            opt.zero_grad()
            loss.backward()
            for p in model.parameters():
                dist.all_reduce(p.grad)
                p.grad /= a.world_size
            opt.step()
            gstep += 1
            log.write(f"{time.time():.3f},{a.attempt},{epoch},{gstep},{loss.item():.6f}\n")
            print(f"rank {a.rank} epoch {epoch} step {gstep} loss {loss.item():.4f}", flush=True)
            if a.rank == 0 and gstep % a.ckpt_every == 0:
                torch.save({"model": model.state_dict(), "step": gstep}, a.ckpt + ".tmp")
                os.replace(a.ckpt + ".tmp", a.ckpt)
                print(f"rank 0 checkpoint at step {gstep}", flush=True)
            time.sleep(a.step_seconds)
    except (RuntimeError, dist.DistBackendError) as e:  # a peer died: reset or timeout
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        print(f"rank {a.rank} lost a peer at step {gstep}: {first[:200]}; exiting for a restart",
              file=sys.stderr, flush=True)
        log.close()
        os._exit(PEER_LOST)
    log.close()
    dist.barrier()
    dist.destroy_process_group()
    print(f"rank {a.rank} finished at step {gstep}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
