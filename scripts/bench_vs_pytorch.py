#!/usr/bin/env python3
"""MatrixFSDP's CPU rank against PyTorch on the same machine, same shapes, same thread count.

Workloads (GPT-2 124M: 12 layers, width 768, 12 heads, vocabulary 50257, tied embeddings):
  train_f32   forward + backward + AdamW, B x T tokens, f32.
              ours: mfsdp-bench-model --dtype f32; PyTorch: a GPT-2 module, f32.
  train_bf16  the same with bf16 matmuls (f32 master weights and accumulation).
              ours: mfsdp-bench-model --dtype bf16 (precision.param_dtype = bf16 runs the same
              kernels); PyTorch: torch.autocast("cpu", dtype=torch.bfloat16) (oneDNN).
  muon_f32    one rank's optimizer step: Muon (momentum 0.95, Nesterov, 5 quintic Newton-Schulz
              steps in f32) on the 48 block matrices plus AdamW on the rest.
              ours: mfsdp-train world 1 on configs/gpt2_124m_shakespeare.json,
              summary.json optimizer_step_seconds_median; PyTorch: the same update written out
              (f32 Newton-Schulz, coefficients 3.4445, -4.7750, 2.0315) + torch.optim.AdamW.
  muon_bf16   the same with optimizer.muon.ns_dtype = bf16; PyTorch: torch.optim.Muon (its
              Newton-Schulz runs in bf16) + torch.optim.AdamW.
Each side runs alone (never concurrently) in a fresh process with the thread count fixed
(OMP_NUM_THREADS, torch.set_num_threads, --threads); medians of the measured steps. Ours runs under
`mpirun --bind-to none` so the rank gets the cores it asks for. The ratio is PyTorch / ours:
above 1 means MatrixFSDP is faster.

PyTorch comes from a virtual environment with a current wheel (scripts/torch_venv.sh makes
.venv-torch); every nvidia/*/lib folder of that environment goes on LD_LIBRARY_PATH.
Usage: python3 scripts/bench_vs_pytorch.py [--build build] [--python .venv-torch/bin/python]
         [--threads 2] [--batch 4] [--seq 64] [--only train_f32,muon_bf16] [--json out.json]
"""
import argparse
import glob
import json
import os
import re
import subprocess
import sys
import tempfile

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
WORKLOADS = ("train_f32", "train_bf16", "muon_f32", "muon_bf16")

TORCH_CHILD = r"""
import json, math, sys, time
import torch
import torch.nn as nn
import torch.nn.functional as F
work, threads, B, T, warmup, steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6])
torch.set_num_threads(threads)
torch.manual_seed(0)
V, L, C, H = 50257, 12, 768, 12

class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln_1, self.ln_2 = nn.LayerNorm(C), nn.LayerNorm(C)
        self.c_attn, self.c_proj = nn.Linear(C, 3 * C), nn.Linear(C, C)
        self.c_fc, self.mlp_proj = nn.Linear(C, 4 * C), nn.Linear(4 * C, C)
    def forward(self, x):
        q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
        q, k, v = (t.view(x.shape[0], x.shape[1], H, C // H).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.c_proj(y.transpose(1, 2).reshape(x.shape))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))

class GPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(V, C), nn.Embedding(1024, C)
        self.h = nn.ModuleList(Block() for _ in range(L))
        self.ln_f = nn.LayerNorm(C)
    def forward(self, idx, tgt):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))
        for b in self.h:
            x = b(x)
        logits = F.linear(self.ln_f(x), self.wte.weight)
        return F.cross_entropy(logits.float().view(-1, V), tgt.view(-1))

model = GPT()
idx = torch.randint(0, V, (B, T))
tgt = torch.randint(0, V, (B, T))
matrices = [p for n, p in model.named_parameters() if p.ndim == 2 and ".h." in "." + n]
others = [p for n, p in model.named_parameters() if not (p.ndim == 2 and ".h." in "." + n)]

def ns_f32(G, steps=5):
    a, b, c = 3.4445, -4.7750, 2.0315
    X = G / (G.norm() + 1e-7)
    tall = X.shape[0] > X.shape[1]
    if tall:
        X = X.T
    for _ in range(steps):
        A = X @ X.T
        X = a * X + (b * A + c * A @ A) @ X
    return X.T if tall else X

class MuonF32(torch.optim.Optimizer):
    def __init__(self, params, lr=0.02, momentum=0.95):
        super().__init__(params, dict(lr=lr, momentum=momentum))
    @torch.no_grad()
    def step(self):
        for g in self.param_groups:
            for p in g["params"]:
                buf = self.state[p].setdefault("m", torch.zeros_like(p))
                buf.mul_(g["momentum"]).add_(p.grad)
                u = ns_f32(p.grad.add(buf, alpha=g["momentum"]))
                p.add_(u, alpha=-g["lr"] * max(1.0, p.shape[0] / p.shape[1]) ** 0.5)

times = []
if work.startswith("train"):
    opt = torch.optim.AdamW(model.parameters(), lr=6e-4, weight_decay=0.1)
    for s in range(warmup + steps):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=False)
        if work == "train_bf16":
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = model(idx, tgt)
        else:
            loss = model(idx, tgt)
        loss.backward()
        opt.step()
        if s >= warmup:
            times.append(time.perf_counter() - t0)
else:
    model(idx, tgt).backward()
    muon = MuonF32(matrices) if work == "muon_f32" else torch.optim.Muon(matrices, lr=0.02, momentum=0.95)
    adamw = torch.optim.AdamW(others, lr=6e-4, weight_decay=0.1)
    for s in range(warmup + steps):
        t0 = time.perf_counter()
        muon.step()
        adamw.step()
        if s >= warmup:
            times.append(time.perf_counter() - t0)
times.sort()
print(json.dumps({"torch": torch.__version__, "seconds": times[len(times) // 2], "n": len(times)}))
"""


def torch_env(python, threads):
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    venv = os.path.dirname(os.path.dirname(os.path.abspath(python)))
    libs = sorted(glob.glob(os.path.join(venv, "lib", "python3*", "site-packages", "nvidia", "**", "lib"),
                            recursive=True))
    env["LD_LIBRARY_PATH"] = ":".join(libs + [env.get("LD_LIBRARY_PATH", "")])
    return env


def run_torch(python, work, threads, batch, seq, warmup, steps):
    out = subprocess.run([python, "-c", TORCH_CHILD, work, str(threads), str(batch), str(seq), str(warmup),
                          str(steps)], env=torch_env(python, threads), capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"bench_vs_pytorch.py: PyTorch {work} failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def run_ours_train(build, work, threads, batch, seq, warmup, steps):
    dtype = "bf16" if work == "train_bf16" else "f32"
    cmd = [os.path.join(build, "bin", "mfsdp-bench-model"), "--dtype", dtype, "--threads", str(threads),
           "-B", str(batch), "-T", str(seq), "--warmup", str(warmup), "--steps", str(steps)]
    out = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, OMP_NUM_THREADS=str(threads)))
    m = re.search(r"median over \d+ steps: ([0-9.]+) ms/step", out.stdout)
    if out.returncode != 0 or not m:
        sys.exit(f"bench_vs_pytorch.py: {' '.join(cmd)} failed:\n{out.stdout[-1500:]}{out.stderr[-1500:]}")
    first = out.stdout.splitlines()[0]
    return {"seconds": float(m.group(1)) / 1e3, "detail": first}


def run_ours_muon(build, work, threads, seq, steps):
    ns_dtype = "bf16" if work == "muon_bf16" else "f32"
    with tempfile.TemporaryDirectory(prefix="mfsdp_vs_torch_") as run_dir:
        sets = {"model.seq_len": seq, "training.steps": steps, "training.eval_interval": 0,
                "training.eval_tokens": 64 * seq, "training.sample_tokens": 0, "logging.interval": 1,
                "logging.run_dir": run_dir, "output.export": "", "optimizer.muon.ns_dtype": ns_dtype}
        cmd = ["mpirun", "-np", "1", "--bind-to", "none", os.path.join(build, "bin", "mfsdp-train"),
               "--config", os.path.join(ROOT, "configs", "gpt2_124m_shakespeare.json"), "--threads", str(threads)]
        for k, v in sets.items():
            cmd += ["--set", f"{k}={v}"]
        out = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
        summary = os.path.join(run_dir, "summary.json")
        if out.returncode != 0 or not os.path.exists(summary):
            sys.exit(f"bench_vs_pytorch.py: {' '.join(cmd)} failed:\n{out.stdout[-1500:]}{out.stderr[-1500:]}")
        with open(summary) as f:
            s = json.load(f)
    return {"seconds": s["optimizer_step_seconds_median"], "detail": f"ns_dtype={ns_dtype}"}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--python", default=os.path.join(ROOT, ".venv-torch", "bin", "python"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--only", default=",".join(WORKLOADS))
    ap.add_argument("--json", help="also write the rows here")
    a = ap.parse_args()
    if a.threads < 1 or a.batch < 1 or a.seq < 1 or a.seq > 1024 or a.steps < 1 or a.warmup < 0:
        ap.error("--threads, --batch, --steps >= 1; 1 <= --seq <= 1024; --warmup >= 0")
    works = [w for w in a.only.split(",") if w]
    if any(w not in WORKLOADS for w in works):
        ap.error(f"--only: choose from {', '.join(WORKLOADS)}")
    if not os.access(a.python, os.X_OK):
        sys.exit(f"bench_vs_pytorch.py: no PyTorch environment at {a.python} (make one: scripts/torch_venv.sh)")
    if os.geteuid() == 0:
        os.environ.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    rows = []
    print(f"{'workload':<11} {'PyTorch s':>10} {'ours s':>9} {'PyTorch/ours':>13}  (B={a.batch} T={a.seq}, "
          f"{a.threads} threads)", flush=True)
    for w in works:
        t = run_torch(a.python, w, a.threads, a.batch, a.seq, a.warmup, a.steps)
        if w.startswith("train"):
            o = run_ours_train(a.build, w, a.threads, a.batch, a.seq, a.warmup, a.steps)
        else:
            o = run_ours_muon(a.build, w, a.threads, a.seq, a.warmup + a.steps)
        rows.append({"workload": w, "torch_version": t["torch"], "torch_seconds": t["seconds"],
                     "ours_seconds": o["seconds"], "ratio": t["seconds"] / o["seconds"]})
        print(f"{w:<11} {t['seconds']:>10.3f} {o['seconds']:>9.3f} {t['seconds'] / o['seconds']:>12.2f}x", flush=True)
    print(f"PyTorch {rows[0]['torch_version'] if rows else '?'}; ours: {a.build}")
    if a.json:
        with open(a.json + ".tmp", "w") as f:
            json.dump(rows, f, indent=1)
        os.replace(a.json + ".tmp", a.json)


if __name__ == "__main__":
    main()
