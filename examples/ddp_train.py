"""SOL under DistributedDataParallel: one process per GPU (nccl), or several CPU processes (gloo).

    torchrun --nproc-per-node 2 examples/ddp_train.py

Toy data; put your own dataset and encoder in their place. Each step trains on the global batch
(every process's batch) with all its pairs, and the end-of-epoch step (centroids, read-out) runs over
the whole training set split between the processes, so every process holds the same head.
"""
import os
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

import sol_ext
from sol_ext.distributed import DistributedStochasticOrderLoss, shard, update_centroids, update_head
from sol_ext.metrics import mae

if torch.cuda.is_available():                      # one GPU per process
    device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", device_id=device)
else:
    device = torch.device("cpu")
    dist.init_process_group("gloo")

torch.manual_seed(0)                               # the same data and initial encoder on every process
x = torch.randn(2500, 8)
labels = (2 * x[:, 0] + 5 + 0.5 * torch.randn(2500)).round().clamp(0, 9).long()   # noisy ranks 0…9
x_train, labels_train, x_test, labels_test = x[:2000], labels[:2000], x[2000:], labels[2000:]
train = TensorDataset(x_train, labels_train)
sampler = DistributedSampler(train, shuffle=True, drop_last=True)   # each process its share of an epoch
loader = DataLoader(train, batch_size=64, sampler=sampler, drop_last=True)   # the same steps everywhere

encoder = torch.nn.Sequential(torch.nn.Linear(8, 64), torch.nn.ReLU(), torch.nn.Linear(64, 16)).to(device)
model = DDP(encoder, device_ids=[device] if device.type == "cuda" else None)
head = sol_ext.SOLHead(num_ranks=10, embedding_dim=16).to(device)
criterion = DistributedStochasticOrderLoss(head.criterion)   # all pairs of the global batch
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3, weight_decay=0.01 * head.num_ranks)


def embed(inputs):                                 # SOL keeps embeddings L2-normalized
    return F.normalize(encoder(inputs.to(device)), dim=1)


def embed_share():
    """This process's share of the training set (every sample on one process), embedded."""
    part = shard(len(x_train))
    encoder.eval()                                 # no dropout or batch-norm updates in this pass
    with torch.no_grad():
        h = torch.cat([embed(chunk) for chunk in x_train[part].split(512)])
    encoder.train()
    return h, labels_train[part].to(device)


update_centroids(head, *embed_share())             # the centroids of the whole training set, everywhere
for epoch in range(5):
    sampler.set_epoch(epoch)
    for inputs, targets in loader:
        h = F.normalize(model(inputs.to(device)), dim=1)   # through DDP: it averages the gradients
        loss = criterion(h, targets.to(device), head.centroids)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    update_head(head, *embed_share())              # centroid rule + read-out across the processes

if dist.get_rank() == 0:                           # every process holds the same model
    with torch.no_grad():
        ranks = head.predict(embed(x_test))
    print(f"{dist.get_world_size()} processes: test MAE {mae(ranks.cpu(), labels_test):.3f}")
    torch.save({"encoder": encoder.state_dict(), "head": head.state_dict()}, "sol_ddp.pt")
dist.destroy_process_group()
# torch 2.14's gloo can abort while the interpreter shuts down after DDP ("terminate called without
# an active exception"); everything is written, so the process ends here
sys.stdout.flush()
os._exit(0)
