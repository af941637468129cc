"""``advtransfer report RUN``: RUN/report/report.md, report.html and LaTeX tables (booktabs).

A report is a list of :class:`Section` objects, each made of paragraphs (plain text), tables and
figures, rendered once to Markdown and once to HTML by jinja2 templates, so both say the same.
Tables with a ``tex`` name are also written to ``report/tables/<tex>.tex``.

Hook point for later sections (e.g. a minimal-distortion section): a module appends a function
``fn(ctx: ReportContext) -> Section | None`` to :data:`OPTIONAL_SECTIONS` (or decorates it with
:func:`register_section`); every registered function runs after the core sections, in order,
and a ``None`` result is skipped. :class:`Raw` blocks carry ready-made Markdown and HTML.
"""
from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pandas as pd

from ...core.errors import UserError
from ...core.metrics import wilson_interval
from ..runs import read_table
from .base import (MINUS, OPTIONAL_SECTIONS, Block, Figure, Raw, ReportContext, Section, SectionFn, Table,
                          html_escape, matrix_table, pct, signed, tex_name, format_p, register_section)


VERDICT_TEXT = {"a_better": "{a} significantly stronger (Holm p < 0.05)",
                "b_better": "{b} significantly stronger (Holm p < 0.05)",
                "no_difference": "no significant difference"}
MATCH_TEXT = {"evals": "its baseline at equal gradient evaluations", "step": "its baseline at equal steps"}


def comparison_sentence(r: pd.Series | dict) -> str:
    """One comparison row as a sentence, e.g. ``cwa vs its baseline at equal gradient evaluations on
    densenet_b (surrogate ens3, ε 8/255): −1.9 points [−4.9, +0.7], McNemar p = 0.21, Holm 0.63:
    no significant difference.`` Differences in percentage points."""
    r = dict(r)
    a, b = r["a_label"], r["b_label"]
    match = r.get("match", "none")
    other = MATCH_TEXT[match] if match in MATCH_TEXT and a != b else b
    if r.get("a_run") and r.get("b_run") and r["a_run"] != r["b_run"]:  # a regression diff of two runs
        a, other = f"{a} ({r['a_run']})", f"{b} ({r['b_run']})"
    p_word = "stratified exact McNemar" if int(r.get("n_strata", 1)) > 1 else "McNemar"
    p_m = format_p(r["p_mcnemar"])
    p_txt = f"{p_word} p {p_m}" if p_m.startswith("<") else f"{p_word} p = {p_m}"
    where = (f"attack {r['attack_label']}" if r.get("compare_by") == "surrogate" else f"surrogate {r['surrogate']}")
    s = (f"{a} vs {other} on {r['victim']} ({where}, ε {r.get('eps_str', r['eps'])}): "
         f"{signed(100 * r['diff'])} points [{signed(100 * r['diff_ci_low'])}, {signed(100 * r['diff_ci_high'])}], "
         f"{p_txt}, Holm {format_p(r['p_holm'])}: "
         + VERDICT_TEXT.get(r["verdict"], r["verdict"]).format(a=r["a_label"], b=r["b_label"]))
    n = int(r.get("n_strata", 1))
    if n > 1:
        s += (f"; pooled over {n} surrogate replicates (per-replicate differences {signed(100 * r['diff_rep_min'])} "
              f"to {signed(100 * r['diff_rep_max'])} points, sd {100 * r['diff_rep_sd']:.1f})")
    return s + f" [{int(r['n_pairs'])} images, {int(r['n_a_only'])} fooled by A only, {int(r['n_b_only'])} by B only]."


# --- core sections ------------------------------------------------------------------------------------
def section_configuration(ctx: ReportContext) -> Section:
    df, man, spec = ctx.results, ctx.manifest, ctx.spec
    first = df.iloc[0]
    items = [
        ("run", str(man.get("run_id") or first.get("run_id", ctx.run_dir.name))),
        ("grid", str(spec.name or man.get("grid_file") or "n/a")),
        ("dataset", f"{first.get('dataset', 'n/a')} / {first.get('split', 'n/a')}, n = {int(first.get('n', 0))} images"),
        ("zoo size", str(first.get("zoo_size", spec.size or "n/a"))),
        ("attacks", ", ".join(sorted(df["attack_label"].unique()))),
        ("ε", ", ".join(dict.fromkeys(df.sort_values("eps")["eps_str"]))),
        ("seeds", ", ".join(str(s) for s in sorted(df["seed"].unique()))),
        ("surrogates", f"{df['surrogate'].nunique()} ({', '.join(sorted(df['surrogate'].unique()))})"),
        ("victims", f"{df['victim'].nunique()} ({', '.join(sorted(df['victim'].unique()))})"),
        ("cells", str(df["cell_id"].nunique())),
        ("git sha", str(man.get("git_sha") or first.get("git_sha", "n/a"))),
        ("device", str(man.get("device") or first.get("device", "n/a"))),
    ]
    if "replicate" in df.columns and df["replicate"].nunique() > 1:
        items.append(("surrogate replicates", str(df["replicate"].nunique())))
    versions = man.get("versions") or {}
    if versions:
        items.append(("versions", ", ".join(f"{k} {v}" for k, v in sorted(versions.items()))))
    for k in ("created_at", "updated_at"):
        if man.get(k):
            items.append((k.replace("_", " "), str(man[k])))
    return Section("Configuration", [Table(["setting", "value"], [[k, v] for k, v in items], tex="configuration",
                                           wrap=True)],
                   "configuration")


CARD_EXTRA = ("data", "init_from", "threads", "num_threads", "device", "torch_version", "versions", "train_device")


def _made_by(card: dict) -> str:
    """What produced a model's weights beyond its recipe, from the card's provenance."""
    p, v = card.get("provenance") or {}, card.get("versions") or {}
    if not p:
        return "not recorded"
    parts = [f"{p.get('threads')} threads", str(p.get("gpu") or p.get("device", "")), str(p.get("machine", ""))]
    if v.get("torch"):
        parts.append(f"torch {v['torch']}")
    if p.get("deterministic_algorithms"):
        parts.append("deterministic")
    return ", ".join(x for x in parts if x)


def section_models(ctx: ReportContext) -> Section:
    df, zoo = ctx.results, ctx.manifest.get("zoo") or {}
    acc = df.groupby("victim").agg(clean_acc=("clean_acc", "mean"), family=("victim_family", "first"))
    names = sorted(set(acc.index) | set(zoo), key=lambda m: (m not in acc.index, m))
    extra = [k for k in CARD_EXTRA if any(k in (zoo.get(m) or {}) for m in names)]
    made = any((zoo.get(m) or {}).get("provenance") for m in names)
    cols = ["model", "arch", "family", "kind", "role", f"clean acc. % (run's {int(df['n'].iloc[0])} images)",
            "clean acc. % (card)", "train s", "sha256", *extra, *(["weights made by"] if made else [])]
    rows = []
    surs = set()
    for s in df["surrogate"].unique():
        surs.update(str(s).split("+"))
    for m in names:
        c = zoo.get(m) or {}
        role = "/".join(r for r, ok in (("surrogate", m in surs), ("victim", m in acc.index)) if ok) or "zoo"
        fam = acc["family"].get(m, c.get("family", "")) if m in acc.index else c.get("family", "")
        ex = []
        for k in extra:
            v = c.get(k, "")
            ex.append(json.dumps(v, sort_keys=True) if isinstance(v, (dict, list)) else str(v))
        rows.append([m, str(c.get("arch", "")), str(fam), str(c.get("kind", "")), role,
                     pct(acc["clean_acc"].get(m, math.nan)) if m in acc.index else "",
                     pct(c["clean_acc"]) if c.get("clean_acc") is not None else "",
                     f"{c['train_s']:.0f}" if c.get("train_s") is not None else "",
                     str(c.get("sha256", ""))[:12], *ex, *([_made_by(c)] if made else [])])
    note = ("Clean accuracy on the run's images (what the ASR denominators count) and, from the zoo card, "
            "on the held-out set the model was scored on when trained.")
    return Section("Models", [note, Table(cols, rows, tex="models")], "models")


def section_asr(ctx: ReportContext) -> Section:
    df = ctx.results
    blocks: list[Block] = ["ASR in percent (successes / clean-correct images of the victim) with Wilson 95% "
                           "intervals; rows with several seeds are pooled. White-box cells are marked †."]
    keys = ["attack_label", "eps", "norm", "targeted"]
    for (label, eps, norm, targeted), sub in df.groupby(keys, sort=True):
        eps_str = sub["eps_str"].iloc[0]
        cap = f"{label} · {norm} ε = {eps_str}{' · targeted' if targeted else ''}: ASR % [95% CI], surrogate × victim"
        tex = f"asr_{label}_{norm}_eps{eps_str}{'_targeted' if targeted else ''}"
        blocks.append(matrix_table(sub, _asr_cell, cap, tex))
    blocks.extend(_defence_blocks(df))
    return Section("Attack success rates", blocks, "asr")


def _asr_cell(g: pd.DataFrame) -> str:
    """One (surrogate, victim) pair's rows pooled: ASR % [Wilson 95% interval], † when white-box."""
    k, n = int(g["n_success"].sum()), int(g["n_clean_correct"].sum())
    lo, hi = wilson_interval(k, n)
    wb = " †" if bool(g["is_whitebox"].any()) else ""
    return f"{pct(k / n if n else math.nan)} [{pct(lo)}, {pct(hi)}]{wb}"


def _defence_blocks(df: pd.DataFrame) -> list[Block]:
    """Stochastic defences (evaluated over several draws) and abstaining ones: what the tables'
    ASR (draw 0) leaves out."""
    draws = df["draws"] if "draws" in df.columns else pd.Series(1, index=df.index)
    abst = df["n_abstain"] if "n_abstain" in df.columns else pd.Series(0, index=df.index)
    sel = df[(draws.fillna(1) > 1) | (abst.fillna(0) > 0)]
    if sel.empty:
        return []
    rows = []
    for _, r in sel.sort_values(["victim", "surrogate", "attack_label", "eps"]).iterrows():
        rows.append([str(r["victim"]), str(r["surrogate"]), str(r["attack_label"]), str(r["eps_str"]),
                     str(int(r.get("draws", 1))), pct(r["asr"]), pct(r.get("asr_draws_mean", math.nan)),
                     pct(r.get("asr_draws_worst", math.nan)), str(int(r.get("n_abstain", 0)))])
    note = ("Stochastic or abstaining victims: the tables above give draw 0's ASR (each image's randomness is "
            "seeded by its bytes, so it reproduces); here also the mean and the worst (highest) ASR over the "
            "draws, and the clean-correct images on whose adversarial version the victim abstained (never "
            "counted as a success).")
    return [note, Table(["victim", "surrogate", "attack", "ε", "draws", "ASR % (draw 0)", "mean % over draws",
                         "worst draw %", "abstentions"], rows, "Stochastic and abstaining defences",
                        tex="defence_draws")]


def section_figures(ctx: ReportContext) -> Section | None:
    figs = sorted((ctx.run_dir / "figures").glob("transfer_*.png"))
    if not figs:
        return Section("Transfer matrices", ["No transfer-matrix figures in the run folder; "
                                             "draw them with `advtransfer plot RUN` and rerun the report."], "figures")
    return Section("Transfer matrices", [Figure(ctx.rel(p), p.stem.replace("_", " ")) for p in figs], "figures")


def section_comparisons(ctx: ReportContext) -> Section:
    cmp = ctx.comparisons
    if cmp is None or cmp.empty:
        return Section("Comparisons", [ctx.comparisons_note or "No comparisons."], "comparisons")
    blocks: list[Block] = [
        "Each attack against its matched baseline on the same images and victim (images the victim classifies "
        "correctly): difference of ASR in percentage points with a 95% interval "
        f"({', '.join(sorted(m.capitalize() for m in cmp['method'].unique()))}), exact McNemar p, and Holm's adjustment over the "
        f"{len(cmp)} comparisons."]
    if (cmp["n_strata"] > 1).any():
        blocks[0] += (" Surrogate replicates are pooled as strata (exact stratified test on the pooled discordant "
                      "pairs); the Newcombe interval treats the pairs of different replicates as independent, "
                      "`--method bootstrap` resamples images together with their replicates.")
    if ctx.comparisons_note:
        blocks[0] += " " + ctx.comparisons_note
    blocks.append(Raw("\n".join(f"- {comparison_sentence(r)}" for _, r in cmp.iterrows()),
                      "<ul>\n" + "\n".join(f"<li>{html_escape(comparison_sentence(r))}</li>" for _, r in cmp.iterrows())
                      + "\n</ul>"))
    rows = [[r["a_label"], r["b_label"], str(r["surrogate"]), r["victim"], str(r["eps_str"]), str(r["match"]),
             str(int(r["n_pairs"])), str(int(r["n_a_only"])), str(int(r["n_b_only"])),
             f"{signed(100 * r['diff'])} [{signed(100 * r['diff_ci_low'])}, {signed(100 * r['diff_ci_high'])}]",
             format_p(r["p_mcnemar"]), format_p(r["p_holm"]), r["verdict"].replace("_", " "), str(int(r["n_strata"]))]
            for _, r in cmp.iterrows()]
    blocks.append(Table(["A", "B", "surrogate", "victim", "ε", "match", "pairs", "A only", "B only",
                         "diff pts [95% CI]", "McNemar p", "Holm p", "verdict", "strata"], rows,
                        "Paired comparisons (A − B)", tex="comparisons"))
    for p in sorted((ctx.run_dir / "figures").glob("forest_comparisons*.png")):
        blocks.append(Figure(ctx.rel(p), "forest plot: " + p.stem.replace("_", " ")))
    return Section("Comparisons", blocks, "comparisons")


def section_verdict(ctx: ReportContext) -> Section | None:
    """The run's answer first, in one screen: one sentence per attack against its matched baselines
    over the held-out victims (victims outside the row's surrogates), the compact verdict figure
    when ``advtransfer compare`` drew it, then the table per surrogate and ε. None without comparisons."""
    from ..verdicts import attack_verdicts, held_out

    cmp = ctx.comparisons
    if cmp is None or cmp.empty:
        return None
    held = held_out(cmp, ctx.results)
    if held.empty:
        return None
    rows = []
    for (a, b, match, eps, s), g in held.groupby(["a_label", "b_label", "match", "eps_str", "surrogate"], sort=True):
        better, worse = int((g["verdict"] == "a_better").sum()), int((g["verdict"] == "b_better").sum())
        d = 100 * g["diff"]
        how = MATCH_TEXT.get(match, b) if a != b else b
        rows.append([str(a), str(how), str(s), str(eps), str(len(g)), str(better), str(worse),
                     str(len(g) - better - worse), f"{signed(d.median())} [{signed(d.min())}, {signed(d.max())}]"])
    lines = [_attack_sentence(r) for _, r in attack_verdicts(held).iterrows()]
    blocks: list[Block] = [
        "Each attack against its matched baselines on the same surrogates and images, over the held-out victims "
        "(victims outside the surrogate set); a comparison is one victim × surrogate × ε × matching, judged by "
        "exact McNemar with Holm's adjustment over the run's comparisons at 0.05."]
    if lines:
        blocks.append(Raw("\n".join(f"- {ln}" for ln in lines),
                          "<ul>\n" + "\n".join(f"<li>{html_escape(ln)}</li>" for ln in lines) + "\n</ul>"))
    for p in sorted((ctx.run_dir / "figures").glob("verdict_comparisons.png")):
        blocks.append(Figure(ctx.rel(p), "every held-out comparison of each attack: difference from its matched "
                                         "baseline in points (red: significantly better, blue: worse, grey: level)"))
    blocks.append(Table(["attack", "against", "surrogate", "ε", "held-out victims", "A better", "B better",
                         "no difference", "diff pts, median [min, max]"], rows,
                        "Per surrogate and ε (every pair with its interval: Comparisons below)", tex="verdict"))
    return Section("Verdict", blocks, "verdict")


def _attack_sentence(r: pd.Series) -> str:
    """``cwa: better than its matched baselines on 14, worse on 3, level on 23 of 40 held-out
    comparisons (2 surrogates, 6 victims, ε 4/255, 8/255); median +2.1 points (step-matched +3.0,
    evals-matched +1.2).``"""
    lean = {(True, False): "better", (False, True): "worse", (True, True): "mixed", (False, False): "level"}[
        (r["better"] > 0, r["worse"] > 0)]
    by = r["median_by_match"]
    per = ", ".join(f"{m}-matched {signed(v)}" for m, v in by.items()) if len(by) > 1 else ""
    return (f"{r['attack']} ({lean}): better than its matched baselines on {r['better']}, worse on {r['worse']}, "
            f"level on {r['level']} of {r['n']} held-out comparisons ({r['surrogates']} surrogate row"
            f"{'s' if r['surrogates'] != 1 else ''}, {r['victims']} victim{'s' if r['victims'] != 1 else ''}, "
            f"ε {r['eps']}); median {signed(r['median_pts'])} points" + (f" ({per})." if per else "."))


def section_compute(ctx: ReportContext) -> Section:
    df = ctx.results
    keys = [k for k in ("cell_id", "attack_label", "surrogate", "eps_str", "seed") if k in df.columns]
    g = df.groupby(keys, sort=False).agg(grad_evals=("grad_evals", "first"), craft_s=("craft_s", "first"),
                                         eval_s=("eval_s", "sum") if "eval_s" in df.columns else ("craft_s", "size"),
                                         victims=("victim", "nunique"),
                                         device=("device", "first") if "device" in df.columns else ("victim", "size"))
    g = g.reset_index().sort_values(["attack_label", "surrogate", "eps_str", "seed"], kind="stable")
    rows = [[str(r["attack_label"]), str(r["surrogate"]), str(r["eps_str"]), str(r["seed"]), str(r["cell_id"])[:10],
             f"{float(r['grad_evals']):.0f}", f"{float(r['craft_s']):.1f}", f"{float(r['eval_s']):.1f}",
             str(r["victims"]), str(r["device"])] for _, r in g.iterrows()]
    total = float(g["craft_s"].sum())
    return Section("Compute", [
        f"Every cell (one crafting job, evaluated on all its victims): gradient evaluations per image on the "
        f"surrogate(s) and wall-clock seconds. Crafting took {total:.0f} s in total.",
        Table(["attack", "surrogate", "ε", "seed", "cell", "grad evals / image", "craft s", "eval s (all victims)",
               "victims", "device"], rows, "Compute per cell", tex="compute")], "compute")


#: the verdict (when the run has matched baselines) comes first: it is what a user who asked for an
#: attack wants to know
CORE_SECTIONS: list[SectionFn] = [section_verdict, section_configuration, section_models, section_asr,
                                  section_figures, section_comparisons, section_compute]


# --- rendering ----------------------------------------------------------------------------------------
def _md_cell(s: str) -> str:
    return str(s).replace("|", "\\|").replace("\n", " ")


_TEX_ESC = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_",
            "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}",
            "ε": r"$\varepsilon$", "†": r"$^\dagger$", MINUS: "$-$", "×": r"$\times$", "·": r"$\cdot$",
            "<": r"$<$", ">": r"$>$"}


def tex_escape(s: str) -> str:
    """Escape LaTeX special characters (and the few non-ASCII symbols the report uses)."""
    return "".join(_TEX_ESC.get(ch, ch) for ch in str(s))


def table_to_latex(t: Table) -> str:
    """A booktabs ``table`` environment (needs ``\\usepackage{booktabs}``)."""
    spec = "".join("r" if n else "l" for n in t.numeric) or "l"
    lines = ["\\begin{table}[ht]", "\\centering", "\\small"]
    if t.caption:
        lines.append(f"\\caption{{{tex_escape(t.caption)}}}")
    lines += [f"\\begin{{tabular}}{{{spec}}}", "\\toprule", " & ".join(tex_escape(c) for c in t.columns) + " \\\\",
              "\\midrule"]
    lines += [" & ".join(tex_escape(c) for c in row) + " \\\\" for row in t.rows]
    lines += ["\\bottomrule", "\\end{tabular}"]
    if t.tex:
        lines.append(f"\\label{{tab:{t.tex}}}")
    lines.append("\\end{table}")
    return "\n".join(lines) + "\n"


MD_TEMPLATE = """\
# advtransfer report: {{ title }}

{% for s in sections %}- [{{ s.title }}](#{{ s.anchor }})
{% endfor %}
{% for s in sections %}
<a id="{{ s.anchor }}"></a>
## {{ s.title }}
{% for b in s.blocks %}
{% if b is string %}{{ b }}
{% elif b.__class__.__name__ == 'Table' %}{% if b.caption %}**{{ b.caption }}**

{% endif %}| {{ b.columns | map('mdcell') | join(' | ') }} |
|{% for r in b.numeric %} {{ '---:' if r else '---' }} |{% endfor %}
{% for row in b.rows %}| {{ row | map('mdcell') | join(' | ') }} |
{% endfor %}{% elif b.__class__.__name__ == 'Figure' %}![{{ b.caption }}]({{ b.src }})
{% else %}{{ b.markdown }}
{% endif %}{% endfor %}
{% endfor %}
"""

HTML_TEMPLATE = """\
<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>advtransfer report: {{ title }}</title>
<style>
body { font: 15px/1.5 -apple-system, "Segoe UI", Roboto, Helvetica, Arial, sans-serif; color: #222;
       max-width: 1100px; margin: 2em auto; padding: 0 1.2em; }
h1 { font-size: 1.6em; border-bottom: 2px solid #333; padding-bottom: .2em; }
h2 { font-size: 1.25em; margin-top: 2em; border-bottom: 1px solid #ccc; padding-bottom: .15em; }
nav ul { columns: 2; list-style: none; padding: 0; } nav a { color: #1a5fb4; text-decoration: none; }
table { border-collapse: collapse; margin: .3em 0 1.4em; font-size: 13px;
        font-variant-numeric: tabular-nums; display: block; overflow-x: auto; max-width: 100%; }
p.caption { font-weight: 600; font-size: 13px; margin: 1.2em 0 .2em; }
th, td { padding: .28em .7em; border-bottom: 1px solid #e3e3e3; text-align: left; white-space: nowrap; }
th.num, td.num { text-align: right; }
table.wrap { display: table; width: 100%; table-layout: fixed; }
table.wrap td, table.wrap th { white-space: normal; vertical-align: top; overflow-wrap: anywhere; }
table.wrap td:first-child, table.wrap th:first-child { width: 11em; }
thead th { border-bottom: 2px solid #555; background: #f6f6f6; }
tbody tr:hover { background: #fafaf0; }
figure { margin: 1em 0 1.8em; } figure img { max-width: min(100%, 900px); border: 1px solid #ddd; }
figcaption { font-size: 13px; color: #555; }
li { margin: .35em 0; }
.meta { color: #666; font-size: 13px; }
</style></head>
<body>
<h1>advtransfer report: {{ title }}</h1>
<nav><ul>{% for s in sections %}<li><a href="#{{ s.anchor }}">{{ s.title }}</a></li>{% endfor %}</ul></nav>
{% for s in sections %}
<section id="{{ s.anchor }}">
<h2>{{ s.title }}</h2>
{% for b in s.blocks %}{% if b is string %}<p>{{ b | inline }}</p>
{% elif b.__class__.__name__ == 'Table' %}{% if b.caption %}<p class="caption">{{ b.caption }}</p>{% endif %}<table{% if b.wrap %} class="wrap"{% endif %}>{% set num = b.numeric %}
<thead><tr>{% for c in b.columns %}<th{% if num[loop.index0] %} class="num"{% endif %}>{{ c }}</th>{% endfor %}</tr></thead>
<tbody>{% for row in b.rows %}<tr>{% for c in row %}<td{% if num[loop.index0] %} class="num"{% endif %}>{{ c }}</td>{% endfor %}</tr>
{% endfor %}</tbody></table>
{% elif b.__class__.__name__ == 'Figure' %}<figure><img src="{{ b.src }}" alt="{{ b.caption }}"><figcaption>{{ b.caption }}</figcaption></figure>
{% else %}{{ b.html | safe }}
{% endif %}{% endfor %}
</section>
{% endfor %}
<p class="meta">Written by <code>advtransfer report</code> from the run folder's results.parquet, samples/ and manifest.json.</p>
</body></html>
"""


def _env():
    import jinja2

    env = jinja2.Environment(autoescape=False, trim_blocks=False, lstrip_blocks=False,
                             undefined=jinja2.StrictUndefined)
    env.filters["mdcell"] = _md_cell
    return env


def render_markdown(title: str, sections: list[Section]) -> str:
    return _env().from_string(MD_TEMPLATE).render(title=title, sections=sections)


def _inline_html(text: str):
    """Escape a paragraph and turn `code` spans into <code> elements."""
    import re

    from markupsafe import Markup, escape

    return Markup(re.sub(r"`([^`]+)`", r"<code>\1</code>", str(escape(text))))


def render_html(title: str, sections: list[Section]) -> str:
    import jinja2

    env = jinja2.Environment(autoescape=True, undefined=jinja2.StrictUndefined)
    env.filters["inline"] = _inline_html
    return env.from_string(HTML_TEMPLATE).render(title=title, sections=sections)


# --- entry point ----------------------------------------------------------------------------------------
def read_comparisons(run_dir: Path) -> pd.DataFrame | None:
    """The run's comparisons.parquet when it is current (at least as new as results.parquet), else
    None: the report reads the table :func:`advtransfer.analysis.measures.compare.refresh_comparisons`
    or ``advtransfer compare`` wrote and never computes or writes one."""
    path, results = run_dir / "comparisons.parquet", run_dir / "results.parquet"
    if path.is_file() and results.is_file() and path.stat().st_mtime_ns < results.stat().st_mtime_ns:
        return None
    return read_table(path, f"advtransfer compare {run_dir}")


def build_report(run_dir: str | Path, out: str | Path | None = None,
                 extra_sections: list[SectionFn] | None = None, comparisons_note: str | None = None) -> dict:
    """Write ``report.md``, ``report.html`` and ``tables/*.tex`` of a run folder into ``out``
    (default ``RUN/report``) from the tables and figures the run folder holds; nothing else in it
    is written. ``comparisons_note``: the note of the step that wrote comparisons.parquet (see
    :func:`advtransfer.cli.report.report_run`); by default, where the table is absent or
    older than results.parquet, the report says to run ``advtransfer compare``.
    Returns ``{'md': Path, 'html': Path, 'tex': [Path, ...]}``."""
    from ...run.store import RunStore
    from ...core.utils import atomic_write_text

    run = Path(run_dir)
    if not run.is_dir():
        raise UserError(f"run folder {str(run_dir)!r} does not exist; pass the folder `advtransfer grid` wrote")
    results = RunStore(run).read_results()
    if results.empty:
        raise UserError(f"{run / 'results.parquet'} has no rows; run `advtransfer grid` first")
    manifest = RunStore(run).read_manifest()
    cmp = read_comparisons(run)
    note = comparisons_note
    if note is None:
        note = "" if cmp is not None else f"No comparisons table: run `advtransfer compare {run}` and rerun the report."
    out_dir = Path(out) if out else run / "report"
    ctx = ReportContext(run, out_dir, results, manifest, cmp, note)
    sections: list[Section] = []
    for fn in [*CORE_SECTIONS, *OPTIONAL_SECTIONS, *(extra_sections or [])]:
        s = fn(ctx)
        if s is not None:
            s.anchor = s.anchor or tex_name(s.title.lower())
            sections.append(s)
    title = str(ctx.manifest.get("run_id") or run.resolve().name)
    md_path, html_path = out_dir / "report.md", out_dir / "report.html"
    out_dir.mkdir(parents=True, exist_ok=True)  # every section read and rendered: a damaged table wrote nothing
    atomic_write_text(md_path, render_markdown(title, sections))
    atomic_write_text(html_path, render_html(title, sections))
    tex_dir = out_dir / "tables"
    if tex_dir.is_dir():
        shutil.rmtree(tex_dir)
    tex_paths = []
    for s in sections:
        for b in s.blocks:
            if isinstance(b, Table) and b.tex:
                p = tex_dir / f"{b.tex}.tex"
                atomic_write_text(p, table_to_latex(b))
                tex_paths.append(p)
    return {"md": md_path, "html": html_path, "tex": tex_paths}


# Optional sections of other analyses register themselves on import (from .base).
from . import distortion  # noqa: E402,F401
from . import generative  # noqa: E402,F401
from . import measures  # noqa: E402,F401
