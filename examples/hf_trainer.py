"""HuggingFace Trainer on mpidist: ``mpidist.torch.use_for_cpu()`` and plain ``mpiexec``.

A tiny BERT built from a config (no download) learns a synthetic task, one epoch::

    mpiexec -n 2 python examples/hf_trainer.py                           # use_for_cpu() inside
    srun --mpi=pmi2 -n 2 python examples/hf_trainer.py
    mpiexec -n 2 python -m mpidist.run --backend-for-cpu mpidist examples/hf_trainer.py --no-use-for-cpu
    mpiexec -n 2 python -m mpidist.run examples/hf_trainer.py --no-use-for-cpu   # torch's gloo

The Trainer (through accelerate) asks for ``ddp_backend="gloo"`` (or leaves it unset) and
accepts no other name on a CPU; :func:`mpidist.torch.use_for_cpu`, called first on every
rank, runs that gloo group on mpidist's MPI backend and gives accelerate the rank, size
and rendezvous from MPI. ``--no-use-for-cpu`` leaves it out, for runs started through
``python -m mpidist.run`` (which does the same from outside).

``--record DIR`` writes, per rank, the sample indices it trained on and its final
parameters; rank 0's last line gives the loss and a hash of the parameters.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import tempfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # everything is built here: never reach for the hub

import torch  # noqa: E402

import mpidist.torch  # noqa: E402


class Tokens(torch.utils.data.Dataset):
    """Random token sequences; the label says whether token 1 occurs more often than token 2."""

    def __init__(self, n: int, length: int = 16, vocab: int = 32, seed: int = 1) -> None:
        g = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(3, vocab, (n, length), generator=g)
        self.ids[:, ::3] = torch.randint(1, 3, (n, (length + 2) // 3), generator=g)
        self.labels = ((self.ids == 1).sum(1) > (self.ids == 2).sum(1)).long()

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict:
        return {"input_ids": self.ids[i], "labels": self.labels[i], "idx": i}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--epochs", type=float, default=1)
    ap.add_argument("--batch-size", type=int, default=16, help="per rank")
    ap.add_argument("--samples", type=int, default=512)
    ap.add_argument("--ddp-backend", default="gloo",
                    help='TrainingArguments(ddp_backend=...): "gloo" or "none"')
    ap.add_argument("--no-use-for-cpu", action="store_true", help="started through python -m mpidist.run")
    ap.add_argument("--record", help="folder for each rank's shard and parameters (JSON)")
    args = ap.parse_args()

    if not args.no_use_for_cpu:
        mpidist.torch.use_for_cpu()  # before the Trainer starts torch.distributed, on every rank
    import transformers  # the Trainer reads the environment use_for_cpu() set

    torch.set_num_threads(1)
    transformers.set_seed(0)
    config = transformers.BertConfig(vocab_size=32, hidden_size=32, num_hidden_layers=1,
                                     num_attention_heads=2,
                                     intermediate_size=64, max_position_embeddings=16, num_labels=2)
    model = transformers.BertForSequenceClassification(config)
    seen: list[int] = []

    def collate(features: list[dict]) -> dict:
        seen.extend(f.pop("idx") for f in features)
        return {k: torch.stack([f[k] for f in features]) for k in features[0]}

    with tempfile.TemporaryDirectory() as out:
        training = transformers.TrainingArguments(
            output_dir=out, use_cpu=True,
            ddp_backend=None if args.ddp_backend == "none" else args.ddp_backend,
            per_device_train_batch_size=args.batch_size, num_train_epochs=args.epochs, learning_rate=1e-3,
            seed=0, report_to=[], save_strategy="no", logging_strategy="no", disable_tqdm=True,
            dataloader_num_workers=0, remove_unused_columns=False, ddp_find_unused_parameters=False)
        trainer = transformers.Trainer(model=model, args=training, train_dataset=Tokens(args.samples),
                                       data_collator=collate)
        result = trainer.train()

    rank, world_size = training.process_index, training.world_size
    params = torch.cat([p.detach().flatten() for p in model.parameters()])
    digest = hashlib.sha256(params.numpy().tobytes()).hexdigest()
    backend = str(torch.distributed.get_backend()) if torch.distributed.is_initialized() else "none"
    if args.record:
        with open(os.path.join(args.record, f"rank{rank}.json"), "w") as f:
            json.dump({"rank": rank, "world_size": world_size, "seen": seen, "params": params.tolist(),
                       "params_sha256": digest, "backend": backend, "loss": result.training_loss}, f)
    if rank == 0:
        print(f"final: world_size={world_size} backend={backend} train_loss={result.training_loss:.6f} "
              f"params_sha256={digest}", flush=True)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
