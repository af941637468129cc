"""What several commands share: the data, cache, device, progress and plugin flags, a run
table's arguments, and the device setup."""
from __future__ import annotations

import argparse
import os


def common_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--data-dir", help="folder with CIFAR-10 train.npz/test.npz (default: $ADVTRANSFER_DATA, else torchvision download)")
    p.add_argument("--cache-dir", help="cache for trained models (default: $ADVTRANSFER_CACHE or ~/.cache/advtransfer)")
    p.add_argument("--device", help="torch device (default: cuda if available, else cpu)")
    p.add_argument("--no-progress", action="store_true", help="hide progress bars")
    plugin_flag(p)


def run_table_args(p: argparse.ArgumentParser) -> None:
    """The arguments of a command that tabulates a run folder: RUN, ``--attack`` and ``--out``."""
    p.add_argument("run_dir", metavar="RUN")
    p.add_argument("--attack", help="comma-separated attack labels (default: all)")
    p.add_argument("--out", metavar="DIR", help="folder for the tables (default: RUN)")


def plugin_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--plugin", action="append", metavar="FILE|MODULE",
                   help="load the user's attacks, networks (a .py file or module) or model catalogue (.yaml) "
                        "first; repeatable (see docs/guides/add-an-attack.md)")


def setup_env(args: argparse.Namespace) -> str:
    """The device to run on (checked: it exists and is available); checks --data-dir."""
    from ..core.config import default_device
    from ..run.validate import check_device

    os.environ.setdefault("HF_HUB_OFFLINE", os.environ.get("HF_HUB_OFFLINE", "0"))
    if getattr(args, "data_dir", None):
        from ..data import resolve_data_dir

        resolve_data_dir(args.data_dir)
    if getattr(args, "device", None):
        return check_device(args.device)
    return check_device(default_device(), "ADVTRANSFER_DEVICE")
