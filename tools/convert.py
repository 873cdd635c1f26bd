#!/usr/bin/env python
"""Convert a softmax-trained ViT to an efficient attention at another resolution (LoLCATs' two stages: attention
transfer, then fine-tuning), on a recipe's data; the result is a run directory that tools/eval.py and
tools/predict.py read.

    tools/convert.py runs/conversion_teacher recipes/conversion_teacher.yaml --attention hedgehog --img-size 96 \\
        --set data.options.canvas_size=96
    tools/convert.py vit_tiny.safetensors recipes/quickstart.yaml --attention linear --stage2-steps 500
    torchrun --nproc_per_node 2 tools/convert.py ...   # each stage data-parallel, as tools/train.py runs

TEACHER: a run directory of tools/train.py (or a checkpoint / save_pretrained folder), or a timm-layout weights file
read into the recipe's architecture with softmax attention. RECIPE: the student (its model and data; --attention and
--img-size change it, --set anything else).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from accelerate import PartialState

from zoo.cli import add_overrides, run_cli
from zoo.config import load_recipe
from zoo.convert.run import convert_run
from zoo.train.distributed import end_processes


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("teacher", help="a run directory (or checkpoint folder) or a timm-layout weights file")
    parser.add_argument("recipe", help="the recipe of the student: its model and data")
    parser.add_argument("--attention", help="the student's attention (default: the recipe's); its options by --set")
    parser.add_argument("--img-size", type=int, help="the student's resolution (default: the recipe's)")
    parser.add_argument("--stage1-steps", type=int, default=100, help="attention-transfer steps (default: 100)")
    parser.add_argument("--stage2-steps", type=int, default=200, help="fine-tuning steps (default: 200)")
    parser.add_argument("--stage1-lr", type=float, default=1e-2, help="attention-transfer learning rate (1e-2)")
    parser.add_argument("--stage2-lr", type=float, default=1e-4, help="fine-tuning learning rate (1e-4)")
    parser.add_argument("--distill", type=float, default=0.5, help="weight of the teacher's logits in stage 2 (0.5)")
    parser.add_argument("--lora-rank", type=int, help="fine-tune low-rank adapters of this rank (needs peft)")
    add_overrides(
        parser,
        "override recipe values, e.g. --set data.options.canvas_size=96 model.attention.options.feature_dim=32",
    )
    parser.add_argument("--output", help="run directory (default: runs/<recipe name>_<attention>_<img size>)")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    # the attention first, replaced whole (the recipe's options belong to its own variant), then the user's values
    changes = [f"model.attention={{name: {args.attention}}}"] if args.attention else []
    changes += [f"model.img_size={args.img_size}"] if args.img_size else []
    recipe = load_recipe(args.recipe, [*changes, *args.overrides])
    name = f"{recipe.name}_{recipe.model.attention.name}_{recipe.model.img_size}"
    run_dir = Path(args.output or Path("runs") / name)
    if (run_dir / "checkpoints").exists():
        raise FileExistsError(f"{run_dir} already holds checkpoints: choose another --output or remove it")
    result = convert_run(
        args.teacher,
        recipe,
        stage1_steps=args.stage1_steps,
        stage2_steps=args.stage2_steps,
        stage1_lr=args.stage1_lr,
        stage2_lr=args.stage2_lr,
        distill_weight=args.distill,
        lora_rank=args.lora_rank,
        run_dir=run_dir,
        log_every=10,
    )
    # under torchrun every process converts (the stages are data-parallel runs); one reports
    if PartialState().is_main_process:
        for stage, metrics in result.metrics.items():
            scores = " ".join(f"{k}={v:.4f}" for k, v in metrics.items() if isinstance(v, float))
            print(f"val after {stage}: {scores}")
        print(f"wrote {run_dir} (tools/eval.py {run_dir}; tools/predict.py {run_dir} INPUT...)")
    # a distributed run ends with exit status 0 after its last save, as tools/train.py's does
    end_processes()


if __name__ == "__main__":
    run_cli(main)
