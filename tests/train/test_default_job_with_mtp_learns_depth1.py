"""The default job turns multi-token prediction on with one override (model.mtp_layers=1): the
depth-1 loss and top-1 accuracy are logged every step, and the accuracy rises during training."""
import json, os, shutil, subprocess, sys, tempfile

from reference.runner import weft_path

WEFT = weft_path()


def main():
    tmp = tempfile.mkdtemp()
    try:
        run = os.path.join(tmp, "run")
        r = subprocess.run([WEFT, "train", "model.mtp_layers=1", "train.steps=80",
                            "train.save_every=0", f"train.output_dir={run}"],
                           capture_output=True, text=True, timeout=600)
        print(r.stdout[-800:])
        assert r.returncode == 0, r.stderr
        with open(os.path.join(run, "metrics.jsonl")) as f:
            rows = [json.loads(l) for l in f]
        assert all(len(x["mtp_accuracy"]) == 1 and len(x["mtp_loss"]) == 1 for x in rows)
        acc = [x["mtp_accuracy"][0] for x in rows]
        first, last = sum(acc[:10]) / 10, sum(acc[-10:]) / 10
        loss_first = sum(x["mtp_loss"][0] for x in rows[:10]) / 10
        loss_last = sum(x["mtp_loss"][0] for x in rows[-10:]) / 10
        print(f"depth-1 accuracy {first:.3f} -> {last:.3f}, depth-1 loss {loss_first:.3f} -> {loss_last:.3f}")
        # Predicting two tokens ahead in worked arithmetic is learnable well past chance (1/257).
        assert last > first + 0.05 and loss_last < loss_first - 1.0, (first, last, loss_first, loss_last)
        with open(os.path.join(run, "checkpoints", "step_00000080", "config.json")) as f:
            assert json.load(f)["num_nextn_predict_layers"] == 1
        print("ok: MTP on with one override, depth-1 accuracy rises")
    finally:
        shutil.rmtree(tmp)


if __name__ == "__main__":
    main()
