"""Grids: a grid file (``grids/*.yaml``) → a validated :class:`GridSpec` → a list of :class:`Cell`.

- :mod:`.spec`: the typed spec, its one :meth:`GridSpec.validate` and :meth:`GridSpec.with_overrides`
  (the CLI's flags);
- :mod:`.load`: grid files → spec (:func:`load_grid`, :func:`resolve_grid_path`);
- :mod:`.runspec`: :class:`RunSpec`, the plain values a run used as its manifest records them, and
  the run's evaluation images (:meth:`RunSpec.eval_images`); no model code, so the analyses read it;
- :mod:`.budget`: how an entry becomes a cell's attack (step and gradient-evaluation budgets, α from
  ε) and the matched MI-FGSM baselines;
- :mod:`.cells`: cell expansion and ids (:func:`expand_cells`).

A cell is one crafting job: (surrogate set, attack with its parameters, ε, seed) on a dataset
subset. Its id hashes the canonical config, including the sha256 of the surrogate weights, so a
retrained surrogate gives new cells and cached adversarial examples are never reused wrongly.
"""
from .budget import BASELINE_ATTACK, alpha_from_eps, is_baseline, matched_baseline, resolve_attack
from .cells import Cell, cell_config, describe, expand_cells
from .load import GRID_KEYS, load_grid, read_grid, resolve_grid_path
from .runspec import RunSpec
from .spec import (AUX_MODEL_KEYS, BUDGETS, GRID_LEVEL_PARAMS, MATCH_KINDS, OVERRIDE_FLAGS, AttackEntry, GridSpec,
                   SurrogateEntry)

__all__ = ["AUX_MODEL_KEYS", "BASELINE_ATTACK", "BUDGETS", "GRID_KEYS", "GRID_LEVEL_PARAMS", "MATCH_KINDS",
           "OVERRIDE_FLAGS", "AttackEntry", "Cell", "GridSpec", "RunSpec", "SurrogateEntry", "alpha_from_eps", "cell_config",
           "describe", "expand_cells", "is_baseline", "load_grid", "matched_baseline", "read_grid",
           "resolve_attack", "resolve_grid_path"]
