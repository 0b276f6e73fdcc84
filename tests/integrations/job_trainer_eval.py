"""The HF Trainer's distributed ``evaluate`` and ``predict`` on mpidist, over data sets of any length.

Started by ``integrations/test_trainer_eval_jobs.py`` as ``mpiexec -n N python job_trainer_eval.py
OUT`` (``mpidist.torch.use_for_cpu()`` first, ``use_cpu=True``). A linear model with the weights
of :func:`weights` classifies the rows of :func:`data`; for every data set length of
``--lengths`` and eval batch size (per rank) of ``--batch-sizes``, each rank writes to
``OUT/rank<r>.json`` what ``evaluate()``, ``predict()`` on the labelled set and ``predict()``
on the same rows without labels returned to it. The test holds them to one process's numpy.

Both :func:`weights` and :func:`data` are numpy with fixed seeds, so that the test can rebuild
them without torch or this file's Trainer.
"""

from __future__ import annotations

import argparse
import json
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # everything is built here: never reach for the hub

import numpy as np  # noqa: E402
import torch  # noqa: E402

import mpidist.torch  # noqa: E402

FEATURES, CLASSES = 4, 3


def weights() -> tuple[np.ndarray, np.ndarray]:
    """The model's (weight, bias), float32."""
    rng = np.random.default_rng(1)
    return (rng.standard_normal((CLASSES, FEATURES)).astype(np.float32),
            rng.standard_normal(CLASSES).astype(np.float32))


def data(length: int) -> tuple[np.ndarray, np.ndarray]:
    """``length`` rows (float32) and their labels; every row differs from the others."""
    rng = np.random.default_rng(1000 + length)
    return rng.standard_normal((length, FEATURES)).astype(np.float32), rng.integers(0, CLASSES, length)


class Rows(torch.utils.data.Dataset):
    def __init__(self, length: int, labelled: bool = True) -> None:
        x, y = data(length)
        self.x, self.y, self.labelled = torch.from_numpy(x), torch.from_numpy(y), labelled

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> dict:
        return {"x": self.x[i], "labels": self.y[i]} if self.labelled else {"x": self.x[i]}


class Linear(torch.nn.Module):
    """Logits and, given labels, the batch's mean cross-entropy, as a transformers model returns them."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(FEATURES, CLASSES)
        w, b = weights()
        with torch.no_grad():
            self.linear.weight.copy_(torch.from_numpy(w))
            self.linear.bias.copy_(torch.from_numpy(b))

    def forward(self, x: torch.Tensor, labels: torch.Tensor | None = None) -> dict:
        logits = self.linear(x)
        if labels is None:
            return {"logits": logits}
        return {"loss": torch.nn.functional.cross_entropy(logits, labels), "logits": logits}


def compute_metrics(p) -> dict:
    """Over the gathered predictions: how many, the accuracy, the mean cross-entropy (float64)."""
    logits, labels = np.asarray(p.predictions, dtype=np.float64), np.asarray(p.label_ids)
    shifted = logits - logits.max(1, keepdims=True)
    nll = np.log(np.exp(shifted).sum(1)) - shifted[np.arange(len(labels)), labels]
    accuracy = float((logits.argmax(1) == labels).mean())
    return {"count": len(labels), "accuracy": accuracy, "xent": float(nll.mean())}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", help="folder for each rank's results (JSON)")
    ap.add_argument("--lengths", default="7,10,11")
    ap.add_argument("--batch-sizes", default="1,2,4", help="per_device_eval_batch_size values")
    args = ap.parse_args()

    mpidist.torch.use_for_cpu()  # before the Trainer starts torch.distributed, on every rank
    import tempfile

    import transformers

    torch.set_num_threads(1)
    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as out:
        for bs in map(int, args.batch_sizes.split(",")):
            training = transformers.TrainingArguments(
                output_dir=out, use_cpu=True, ddp_backend="gloo", per_device_eval_batch_size=bs, report_to=[],
                disable_tqdm=True, dataloader_num_workers=0, remove_unused_columns=False)
            trainer = transformers.Trainer(model=Linear(), args=training, compute_metrics=compute_metrics)
            for length in map(int, args.lengths.split(",")):
                evaluated = trainer.evaluate(Rows(length))
                predicted = trainer.predict(Rows(length))
                unlabelled = trainer.predict(Rows(length, labelled=False))
                results[f"{length}/{bs}"] = {
                    "evaluate": evaluated,
                    "predict": {"predictions": predicted.predictions.tolist(),
                                "label_ids": predicted.label_ids.tolist(), "metrics": predicted.metrics},
                    "unlabelled": {"predictions": unlabelled.predictions.tolist(),
                                   "label_ids": unlabelled.label_ids, "metrics": unlabelled.metrics}}
    rank = training.process_index
    record = {"rank": rank, "world_size": training.world_size, "parallel_mode": str(training.parallel_mode),
              "backend": str(torch.distributed.get_backend()), "results": results}
    with open(os.path.join(args.out, f"rank{rank}.json"), "w") as f:
        json.dump(record, f)


if __name__ == "__main__":
    main()
