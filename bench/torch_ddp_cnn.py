#!/usr/bin/python3
"""PyTorch DDP twin of `cohort-train --model cnn --dataset fashion-mnist` (the reference
side of bench/train_bench.py).

    torchrun --redirects 2 --tee 2 --standalone --nproc_per_node 2 \
        bench/torch_ddp_cnn.py --data-dir /usr/share/datasets/fashion-mnist \
        --max-steps 500 --log-every 50 --metrics-file /tmp/torch.jsonl

Kept equal to cohort-train on purpose (cohort/train/models.cc, data.cc, cohort_train_main.cc):
  model     the `cnn` for 1x28x28 input: conv(1->16,5x5) relu maxpool2 -> conv(16->32,5x5)
            relu maxpool2 -> flatten(512) -> fc 120 relu -> fc 84 relu -> fc 10
            (85,822 parameters; torch's default init, seeded like cohort: manual_seed(seed))
  data      the same gz idx files read with gzip+numpy, uint8 kept in memory; a batch is
            index_select -> float / 255 -> (x - 0.2860) / 0.3530, labels int64
  sampler   torch.utils.data.DistributedSampler(shuffle, seed, pad to a multiple of the
            world size, last partial batch kept), batches cut from its index list (no
            DataLoader collate per sample, no worker processes)
  step      zero_grad, forward, cross_entropy, backward (DDP gradient allreduce, gloo,
            default 25 MB buckets / 1 MB first bucket like cohort), SGD step, loss.item()
  logging   every --log-every steps the loss sum is allreduced (as cohort does) and rank 0
            appends a JSON line {"event": "step", "step", "samples_per_s", "window_s", ...}
            in cohort-train's --metrics-file format; the window clock starts before the
            first step and restarts after each line, exactly like cohort-train's
  threads   torch.set_num_threads(1), set_num_interop_threads(1) (cohort: OMP_NUM_THREADS=1)
No checkpoints, no evaluation unless --eval.

Communication share (torch has no counter like cohort's comm_wait_s): each window also
records the time rank 0 spent in loss.backward() (where DDP's reducer waits for its
allreduce), and after the timed steps --calib-steps more steps run under ddp.no_sync()
(no allreduce). The end event carries both mean backward times and the mean step time;
(bwd_sync - bwd_nosync) / step is the exposed communication share. With world size 1 the
calibration is skipped.
"""
import argparse
import gzip
import json
import os
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data.distributed import DistributedSampler

MEAN, STD = 0.2860, 0.3530  # cohort/train/data.cc, fashion-mnist


class Cnn(nn.Module):
    def __init__(self, channels=1, height=28, width=28, classes=10):
        super().__init__()
        c1, c2 = (16, 32) if channels == 1 else (6, 16)
        self.conv1 = nn.Conv2d(channels, c1, 5)
        self.conv2 = nn.Conv2d(c1, c2, 5)
        h, w = ((height - 4) // 2 - 4) // 2, ((width - 4) // 2 - 4) // 2
        self.fc1 = nn.Linear(c2 * h * w, 120)
        self.fc2 = nn.Linear(120, 84)
        self.fc3 = nn.Linear(84, classes)

    def forward(self, x):
        x = F.max_pool2d(torch.relu(self.conv1(x)), 2)
        x = F.max_pool2d(torch.relu(self.conv2(x)), 2)
        x = x.flatten(1)
        x = torch.relu(self.fc1(x))
        x = torch.relu(self.fc2(x))
        return self.fc3(x)


def read_idx(path):
    with gzip.open(path, "rb") as f:
        data = f.read()
    magic = int.from_bytes(data[0:4], "big")
    ndim = magic & 0xFF
    dims = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim)]
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


def load(data_dir, train):
    prefix = "train" if train else "t10k"
    images = read_idx(os.path.join(data_dir, "%s-images-idx3-ubyte.gz" % prefix))
    labels = read_idx(os.path.join(data_dir, "%s-labels-idx1-ubyte.gz" % prefix))
    x = torch.from_numpy(images.copy()).unsqueeze(1)  # N,1,28,28 uint8
    y = torch.from_numpy(labels.astype(np.int64))
    return x, y


def gather(x, y, idx):
    idx = torch.as_tensor(idx, dtype=torch.int64)
    xb = x.index_select(0, idx).to(torch.float32).div_(255.0).sub_(MEAN).div_(STD)
    return xb, y.index_select(0, idx)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data-dir", default="/usr/share/datasets/fashion-mnist")
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--batch-size", type=int, default=64, help="per worker")
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--momentum", type=float, default=0.9)
    ap.add_argument("--weight-decay", type=float, default=0.0)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--max-steps", type=int, default=0, help="0: no limit")
    ap.add_argument("--log-every", type=int, default=50)
    ap.add_argument("--metrics-file", default="")
    ap.add_argument("--calib-steps", type=int, default=100,
                    help="extra no_sync steps after the timed ones (comm share estimate)")
    ap.add_argument("--eval", action="store_true", help="test accuracy at the end")
    ap.add_argument("--tag", default="", help="ignored")
    a = ap.parse_args()

    torch.set_num_threads(1)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:
        pass

    x, y = load(a.data_dir, True)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    leader = rank == 0

    torch.manual_seed(a.seed)
    model = Cnn()
    ddp = DDP(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=a.lr, momentum=a.momentum,
                          weight_decay=a.weight_decay)
    sampler = DistributedSampler(range(len(y)), num_replicas=world, rank=rank, shuffle=True,
                                 seed=a.seed, drop_last=False)
    B = a.batch_size
    per_epoch = (len(sampler) + B - 1) // B
    total = per_epoch * a.epochs
    if a.max_steps > 0:
        total = min(total, a.max_steps)
    if leader:
        nparams = sum(p.numel() for p in model.parameters())
        print("training cnn (%d parameters) on fashion-mnist (%d samples) with %d worker(s), "
              "batch %d per worker, %d steps per epoch, %d steps in all, sgd lr %g (torch %s DDP gloo)"
              % (nparams, len(y), world, B, per_epoch, total, a.lr, torch.__version__), flush=True)
    metrics = open(a.metrics_file, "a") if (leader and a.metrics_file) else None

    def batches(epoch):
        sampler.set_epoch(epoch)
        idx = list(sampler)
        for i in range(0, len(idx), B):
            yield gather(x, y, idx[i:i + B])

    ddp.train()
    step = 0
    loss_sum, loss_n = 0.0, 0
    bwd_win = 0.0
    bwd_all, steps_all = 0.0, 0
    t_start = time.perf_counter()
    t_win = t_start
    win_steps = 0
    epoch = 0
    while step < total and epoch < a.epochs:
        for xb, yb in batches(epoch):
            if step >= total:
                break
            opt.zero_grad()
            loss = F.cross_entropy(ddp(xb), yb)
            tb = time.perf_counter()
            loss.backward()
            bwd_win += time.perf_counter() - tb
            opt.step()
            step += 1
            win_steps += 1
            loss_sum += loss.item()
            loss_n += 1
            if step % a.log_every == 0 or step == total:
                l = torch.tensor([loss_sum, float(loss_n)], dtype=torch.float64)
                dist.all_reduce(l)
                loss_sum, loss_n = 0.0, 0
                if leader:
                    now = time.perf_counter()
                    w = now - t_win
                    sps = win_steps * B * world / max(w, 1e-9)
                    print("epoch %d/%d step %d/%d loss %.4f samples/s %.0f backward %.1f%%"
                          % (epoch + 1, a.epochs, step, total, l[0] / max(l[1], 1.0), sps,
                             100.0 * bwd_win / max(w, 1e-9)), flush=True)
                    if metrics:
                        metrics.write(json.dumps({
                            "event": "step", "step": step, "epoch": epoch + 1,
                            "loss": float(l[0] / max(l[1], 1.0)), "samples_per_s": sps,
                            "window_s": w, "backward_s": bwd_win, "elapsed_s": now - t_start,
                            "world_size": world}) + "\n")
                        metrics.flush()
                bwd_all += bwd_win
                steps_all += win_steps
                bwd_win = 0.0
                win_steps = 0
                t_win = time.perf_counter()
        epoch += 1
    train_s = time.perf_counter() - t_start

    # Calibration: the same steps without the gradient allreduce (not part of the timing).
    calib = {}
    if world > 1 and a.calib_steps > 0:
        bwd_ns, n_ns = 0.0, 0
        t0 = time.perf_counter()
        with ddp.no_sync():
            for i, (xb, yb) in enumerate(batches(epoch + 1)):
                if i >= a.calib_steps:
                    break
                opt.zero_grad()
                loss = F.cross_entropy(ddp(xb), yb)
                tb = time.perf_counter()
                loss.backward()
                bwd_ns += time.perf_counter() - tb
                n_ns += 1
                opt.step()
                loss.item()
        calib = {"nosync_steps": n_ns, "nosync_backward_mean_s": bwd_ns / max(n_ns, 1),
                 "nosync_step_mean_s": (time.perf_counter() - t0) / max(n_ns, 1)}
    dist.barrier()

    acc = None
    if a.eval:
        xt, yt = load(a.data_dir, False)
        ddp.eval()
        cnt = torch.zeros(2, dtype=torch.int64)
        with torch.no_grad():
            mine = list(range(rank, len(yt), world))
            for i in range(0, len(mine), 500):
                xb, yb = gather(xt, yt, mine[i:i + 500])
                cnt[0] += int(model(xb).argmax(1).eq(yb).sum())
                cnt[1] += len(yb)
        dist.all_reduce(cnt)
        acc = float(cnt[0]) / float(cnt[1])

    if leader:
        print("done: %d steps in %.1fs (%.0f samples/s)" % (step, train_s,
                                                           step * B * world / train_s))
        if acc is not None:
            print("test_accuracy %.4f" % acc)
        end = {"event": "end", "step": step, "train_s": train_s,
               "sync_backward_mean_s": bwd_all / max(steps_all, 1),
               "step_mean_s": train_s / max(step, 1), "test_accuracy": acc}
        end.update(calib)
        try:  # DDP's own sampled runtime stats (ns), when this build records them on CPU
            d = ddp._get_ddp_logging_data()
            end["ddp_logging"] = {k: d[k] for k in d if k.startswith("avg_")}
        except Exception:  # noqa: BLE001 - optional
            pass
        if metrics:
            metrics.write(json.dumps(end) + "\n")
            metrics.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
