"""``advtransfer pas``: a PAS-style search of a surrogate's backpropagation path."""
from __future__ import annotations

import argparse

from ..core.errors import UserError
from .common import common_args, setup_env

#: test images the grids and claims evaluate on (0..999); a path search never scores on them
EVAL_IMAGES = 1000


def pas_images(n_train: int, used: int, n: int) -> tuple[str, int]:
    """Where a path search scores its ``n`` images: (split, first index). Training images after the
    ``used`` ones the surrogate's recipe trained on; if fewer than ``n`` are left (a converged
    model trains on all of them), test images after the first :data:`EVAL_IMAGES`, which no
    grid's default ``n`` reaches."""
    if n_train - used >= n:
        return "train", used
    return "test", EVAL_IMAGES


def add_parser(sub: argparse._SubParsersAction) -> None:
    ps = sub.add_parser("pas", help="search a backpropagation path for a surrogate (PAS-style): one-step "
                                     "attacks on held-out training images scored on validation models you own")
    ps.add_argument("model", help="the surrogate (a trained single zoo model)")
    ps.add_argument("--validators", required=True,
                    help="comma-separated zoo models that score the paths (the attacker's own models, never the victims)")
    ps.add_argument("--n", type=int, default=500, help="held-out training images to score on (default 500)")
    ps.add_argument("--budget", type=int, default=40, help="candidate paths scored (default 40)")
    ps.add_argument("--search", default="bo", choices=("bo", "random"),
                    help="bo: Bayesian optimisation (Gaussian process, expected improvement; as the PAS paper; "
                         "needs optuna: the search extra) or random: distinct paths drawn uniformly (default bo)")
    ps.add_argument("--eps", default="8/255", help="one-step size (default 8/255)")
    ps.add_argument("--seed", type=int, default=0)
    ps.add_argument("--size", help="zoo size (default: $ADVTRANSFER_SIZE or converged)")
    ps.add_argument("--out", help="also write the scored paths as JSON here")
    common_args(ps)


def run(args: argparse.Namespace) -> int:
    import json
    from pathlib import Path

    from ..attacks.pas import search_path
    from ..core.config import zoo_size
    from ..data import load_dataset
    from ..models import zoo
    from ..core.utils import parse_fraction

    # every argument is checked before a model trains or a file is written
    device = setup_env(args)
    size = zoo_size(args.size)
    validators = [v.strip() for v in args.validators.split(",") if v.strip()]
    if not validators or args.model in validators:
        raise UserError("--validators needs one or more zoo models other than the surrogate")
    for name in (args.model, *validators):  # an unknown name, or an entry without this size: one line now
        zoo.get_spec(name).identity(size)
    if args.n < 1:
        raise UserError(f"--n must be >= 1 (held-out training images to score on), got {args.n}")
    data = load_dataset(zoo.get_spec(args.model).dataset, "train", args.data_dir)
    if args.n > len(data):
        raise UserError(f"--n {args.n} exceeds the {len(data)} training images")
    if args.budget < 1:
        raise UserError(f"--budget must be >= 1 (candidate paths to score), got {args.budget}")
    eps = parse_fraction(args.eps, "eps")
    if not 0 < eps <= 1:
        raise UserError(f"--eps {args.eps} is outside (0, 1]; give it like 8/255")
    if args.search == "bo":
        try:
            import optuna  # noqa: F401
        except ImportError:
            raise UserError("the bo path search needs optuna: pip install 'advtransfer[search]' "
                            "(or pass --search random)") from None
    if args.out:
        out = Path(args.out)
        if out.is_dir():
            raise UserError(f"--out {args.out!r} is a folder; give the path of the JSON file to write")
        if not out.parent.is_dir():
            raise UserError(f"--out {args.out!r}: folder {str(out.parent)!r} does not exist; create it first")
    zoo.ensure_trained([args.model, *validators], size, args.cache_dir, args.data_dir, device, not args.no_progress)
    card = zoo.read_card(args.model, size, args.cache_dir) or {}
    model = zoo.load_model(args.model, size, args.cache_dir, device, member=0)
    vals = [zoo.load_model(v, size, args.cache_dir, device, member=0) for v in validators]
    used = int((card.get("recipe") or {}).get("train_subset") or len(data))
    split, start = pas_images(len(data), used, args.n)
    if split == "test":
        data = load_dataset(zoo.get_spec(args.model).dataset, "test", args.data_dir)
        if start + args.n > len(data):
            raise UserError(f"--n {args.n}: the surrogate trained on every training image and the test set has only "
                            f"{len(data) - start} images after the {start} that grids evaluate on; pass a smaller --n")
    x, y = data.tensors(list(range(start, start + args.n)))[:2]
    where = ("not in its recipe's subset" if split == "train" else
             f"the surrogate trained on every training image; these follow the {start} test images grids evaluate on")
    print(f"path search for {args.model} on {split} images {start}..{start + args.n - 1} "
          f"({where}), scored on {', '.join(validators)}; {args.budget} candidates by {args.search} search")
    res = search_path(model, vals, x.to(device), y.to(device), eps, args.budget, args.seed, log=print,
                      method=args.search)
    best = res["best"]
    refs = res["references"]
    print("references: " + ", ".join(f"{k} {v['score']:.3f}" for k, v in refs.items()))
    print(f"best ({best['label']}, one-step ASR {best['score']:.3f}); as grid parameters:")
    print(f"  pas: {{gammas: {best['gammas']}, deltas: {best['deltas']}}}")
    if args.out:
        from ..core.utils import atomic_write_text  # complete or absent, never half-written

        atomic_write_text(Path(args.out), json.dumps({"model": args.model, "validators": validators,
                                                      "images": [start, start + args.n], "eps": eps,
                                                      "seed": args.seed, **res}, indent=1))
    return 0
