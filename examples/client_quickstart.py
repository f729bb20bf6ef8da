"""kubetrain.client, notebook style: each `# %%` is a cell (VS Code, PyCharm and Jupytext run them
one by one; pasted into Jupyter they work the same). As a script it runs on this machine:

    pip install 'kubetrain[client,trainer]'
    python examples/client_quickstart.py

For a cluster with the kubetrain operator, change the one line that makes the client:
`Client(namespace="my-team")` (your kubeconfig's context, or kubeconfig=...).
"""

# %%
import torch

from kubetrain.client import Client
from kubetrain.trainer import lib

SAMPLES_PER_RANK = 256


# %% The training function. It runs on every rank, under torchrun, its process group set up:
# lib.context() tells the rank, and lib.DDP averages the gradients across ranks. It is shipped
# by source with what it reads: the module `torch`, `lib` and the constant SAMPLES_PER_RANK.
def fit_line(lr: float, steps: int = 100) -> None:
    """Fit y = 3x + 1: each rank draws its own slice of the data, DDP averages the gradients."""
    ctx = lib.context()
    generator = torch.Generator().manual_seed(ctx.rank)
    x = torch.rand(SAMPLES_PER_RANK, 1, generator=generator)
    y = 3 * x + 1 + 0.05 * torch.randn(SAMPLES_PER_RANK, 1, generator=generator)
    model = lib.DDP(torch.nn.Linear(1, 1))  # DDP starts every rank from rank 0's weights
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    for step in range(1, steps + 1):
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        if step % 10 == 0:  # rank 0's records: the progress bar, job.metrics()
            lib.log0(ctx, "step", step=step, epoch=0, total_steps=steps, loss=loss.item())
    weight, bias = model.module.weight.item(), model.module.bias.item()
    print(f"rank {ctx.rank} of {ctx.world_size}: y = {weight:.2f}x + {bias:.2f}", flush=True)


# %% Two nodes of one process each; locally each node is a torchrun process tree of this machine.
client = Client("local", run_dir="runs")
job = client.train(fit_line, nodes=2, args=(0.5,))
print(job)

# %% A progress bar on a terminal or in a notebook; JobFailed (with the failure) if it fails.
status = job.wait()
print(status.phase, "after", status.restarts, "restarts")

# %% Every node's output, `[node-i]`-prefixed as `kubetrain logs` prints it.
for line in job.logs():
    print(line)

# %% Rank 0's records, ready for `pandas.DataFrame(job.metrics())`.
for record in job.metrics():
    print(f"step {record['step']:>3}  loss {record['loss']:.5f}")

# %% The job, its processes and its run directory go.
job.delete()
