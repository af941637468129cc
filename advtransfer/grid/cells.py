"""Cell expansion and cell ids.

A cell is one crafting job: (surrogate set, attack with its parameters, ε, seed) on a dataset
subset. Its id hashes the canonical config, including the sha256 of the surrogate weights, so a
retrained surrogate gives new cells and cached adversarial examples are never reused wrongly.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from ..core.utils import eps_to_str, short_hash
from .budget import BASELINE_ATTACK, is_baseline, matched_baseline, resolve_attack
from .spec import AUX_MODEL_KEYS, AttackEntry, GridSpec, SurrogateEntry


@dataclass(frozen=True)
class Cell:
    """One crafting job. ``config`` is the canonical JSON-able description hashed into ``cell_id``;
    ``resolved`` is the attack the cell runs, made once when the grid is expanded (its parameters
    resolved against the grid, ε and seed: :func:`~advtransfer.grid.resolve_attack`). Whoever
    crafts with it takes a copy (:meth:`fresh_attack`), so a retried cell starts from the attack as
    made, never from the state a failed try left in it."""

    cell_id: str
    surrogate: SurrogateEntry
    attack: AttackEntry
    eps: float
    seed: int
    config: dict
    resolved: Any = field(default=None, compare=False, repr=False)

    def fresh_attack(self) -> Any:
        """A copy of :attr:`resolved` to craft with."""
        import copy

        return copy.deepcopy(self.resolved)


def cell_config(spec: GridSpec, s: SurrogateEntry, a: AttackEntry, seed: int, attack: Any,
                model_shas: dict[str, str]) -> dict:
    """The canonical config of a cell (what its id hashes): data, surrogates with their weight
    checksums, the resolved attack with its kind, version and parameters, the seed."""
    from ..attacks.base import PER_IMAGE_KINDS

    config = {
        "dataset": spec.dataset, "split": spec.split, "start": spec.start, "n": spec.n,
        "size": spec.size, "surrogate": list(s.models),
        "surrogate_weights": list(s.weights) if s.weights else None,
        "surrogate_sha": [model_shas[m] for m in s.models], "label": a.label,
        "attack": a.attack, "attack_kind": attack.kind, "attack_version": attack.version,
        "attack_params": attack.params(), "seed": seed,
    }
    if s.options:
        config["surrogate_options"] = dict(s.options)
    if spec.craft_dataset and attack.kind not in PER_IMAGE_KINDS:
        config["craft_dataset"] = spec.craft_dataset
    aux = {str(v): model_shas[str(v)] for k, v in attack.params().items() if k in AUX_MODEL_KEYS and v}
    if aux:  # e.g. the CLIP model a generator is conditioned on
        config["aux_sha"] = aux
    if attack.batch_dependent:  # randomness drawn per crafting batch: another batch size is another cell
        config["craft_batch"] = spec.batch_size
    if spec.precision != "fp32":  # mixed precision changes the examples (never an fp32 cell's id)
        config["precision"] = spec.precision
    code = plugin_code(spec, s, a.attack)
    if code:  # the attack or a surrogate network is a plugin's: its source's sha256 (advtransfer.plugins)
        config["plugin_code"] = code
    return config


def plugin_code(spec: GridSpec, s: SurrogateEntry, attack: str) -> dict[str, str]:
    """sha256 of the plugin sources behind a cell: its attack's, its surrogate networks' (empty
    when everything is the harness's own, so those cells keep their ids)."""
    from ..attacks import ATTACKS
    from ..models.archs import ARCHS

    out = {}
    sha = ATTACKS.code(attack)
    if sha:
        out[f"attack {attack}"] = sha
    if any(ARCHS.code(n) for n in ARCHS.names()):
        from ..models.zoo import get_spec, load_specs

        specs = load_specs()
        for m in s.models:
            ms = get_spec(m, specs)
            arch = ms.declared().arch_name(spec.size)
            sha = ARCHS.code(arch)
            if sha:
                out[f"architecture {arch}"] = sha
    return out


def expand_cells(spec: GridSpec, model_shas: dict[str, str]) -> list[Cell]:
    """All cells of the grid. ``model_shas`` maps model name → sha256 of its weights.

    With ``matched`` the grid adds, for each (surrogate set, attack, ε, seed) whose attack is a
    per-image kind and not itself the baseline, the matched MI-FGSM baselines (see
    :func:`advtransfer.grid.matched_baseline`); a baseline serving several attacks is one cell whose
    ``baseline_for`` lists them."""
    from ..attacks import ATTACKS
    from ..attacks.base import PER_IMAGE_KINDS

    cells: dict[str, Cell] = {}

    def add(s: SurrogateEntry, a: AttackEntry, eps: float, seed: int, attack: Any) -> None:
        config = cell_config(spec, s, a, seed, attack, model_shas)
        cid = short_hash(config)
        if cid in cells:  # a shared baseline: it serves one more attack
            old = cells[cid]
            fors = old.attack.baseline_for.split(",") + [f for f in a.baseline_for.split(",") if f]
            a = replace(old.attack, baseline_for=",".join(dict.fromkeys(fors)))
        cells[cid] = Cell(cid, s, a, eps, seed, config, attack)

    for s in spec.surrogates:
        for a in (a for a in spec.attacks if s.runs(a, spec.size)):
            for eps in spec.eps:
                for seed in spec.seeds:
                    attack = resolve_attack(a, spec, eps, seed, len(s.models))
                    add(s, a, eps, seed, attack)
                    if is_baseline(a) or ATTACKS.get(a.attack).kind not in PER_IMAGE_KINDS:
                        continue
                    for match in dict.fromkeys(spec.matched):
                        label, params = matched_baseline(attack, match, len(s.models), a.params.get("momentum"))
                        b = AttackEntry(label, BASELINE_ATTACK, params, match, a.label)
                        add(s, b, eps, seed, resolve_attack(b, spec, eps, seed, len(s.models)))
    return list(cells.values())


def describe(cell: Cell) -> str:
    """One line naming a cell: surrogate · attack label · ε · seed."""
    return f"{cell.surrogate.name} · {cell.attack.label} · {eps_to_str(cell.eps)} · seed {cell.seed}"
