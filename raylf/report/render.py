"""A report as Markdown, self-contained HTML (figures embedded) or LaTeX (booktabs).

Best entries are bold and second-best underlined in all three (Markdown has no underline:
``<u>``, which GitHub and most viewers render).
"""

from __future__ import annotations

import base64
import html
import re
from dataclasses import dataclass, field

from raylf.report.figures import Plot
from raylf.report.tables import Table

FORMATS = {"md": "report.md", "html": "report.html", "latex": "report.tex"}


@dataclass
class Section:
    title: str
    tables: list[Table] = field(default_factory=list)
    plots: list[Plot] = field(default_factory=list)
    text: str = ""


@dataclass
class Report:
    title: str
    summary: str
    sections: list[Section]
    banner: list[str] = field(default_factory=list)  # warnings shown above everything else


def _rows(table: Table, mark) -> list[list[str]]:
    return [[mark(str(table.cells.iat[i, j]), table.marks.iat[i, j])
             for j in range(table.cells.shape[1])] for i in range(len(table.cells))]


def markdown_table(table: Table) -> str:
    def mark(text: str, how: str) -> str:
        text = text.replace("|", "\\|")
        return {"best": f"**{text}**", "second": f"<u>{text}</u>"}.get(how, text)

    header = [str(c) for c in table.cells.columns]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in _rows(table, mark)]
    return "\n".join(lines)


def markdown(report: Report) -> str:
    parts = [f"# {report.title}", *[f"> **{line}**" for line in report.banner], report.summary]
    for section in report.sections:
        parts.append(f"## {section.title}")
        if section.text:
            parts.append(section.text)
        for table in section.tables:
            parts += [f"### {table.title}", table.note, markdown_table(table)]
        parts += [f"![{plot.caption}](figures/{plot.name}.png)" for plot in section.plots]
    return "\n\n".join(p for p in parts if p) + "\n"


STYLE = """body{font-family:system-ui,sans-serif;max-width:1200px;margin:2em auto;padding:0 1em}
table{border-collapse:collapse;margin:.5em 0 1.5em;font-size:.9em}
th,td{border:1px solid #ccc;padding:.25em .6em;text-align:right;white-space:nowrap}
th{background:#f3f3f3}td:first-child,th:first-child{text-align:left}
p.note{color:#555;font-size:.9em;max-width:60em}figure{margin:1em 0}
p.banner{background:#fdd;border:2px solid #c00;padding:.6em;font-weight:bold}
figcaption{color:#555;font-size:.9em}img{max-width:100%}.scroll{overflow-x:auto}"""


def html_table(table: Table) -> str:
    def mark(text: str, how: str) -> str:
        text = html.escape(text)
        return {"best": f"<b>{text}</b>", "second": f"<u>{text}</u>"}.get(how, text)

    head = "".join(f"<th>{html.escape(str(c))}</th>" for c in table.cells.columns)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>"
                   for row in _rows(table, mark))
    return (f"<div class='scroll'><table><thead><tr>{head}</tr></thead><tbody>{body}</tbody>"
            "</table></div>")


def html_page(report: Report) -> str:
    parts = [f"<h1>{html.escape(report.title)}</h1>",
             *[f"<p class='banner'>{html.escape(line)}</p>" for line in report.banner],
             f"<p>{html.escape(report.summary)}</p>"]
    for section in report.sections:
        parts.append(f"<h2>{html.escape(section.title)}</h2>")
        if section.text:
            parts.append(f"<p>{html.escape(section.text)}</p>")
        for table in section.tables:
            parts += [f"<h3>{html.escape(table.title)}</h3>",
                      f"<p class='note'>{html.escape(table.note)}</p>", html_table(table)]
        for plot in section.plots:
            data = base64.b64encode(plot.png).decode()
            parts.append(f"<figure><img alt='{html.escape(plot.name)}' "
                         f"src='data:image/png;base64,{data}'>"
                         f"<figcaption>{html.escape(plot.caption)}</figcaption></figure>")
    return ("<!doctype html><html><head><meta charset='utf-8'>"
            f"<title>{html.escape(report.title)}</title><style>{STYLE}</style></head><body>"
            + "\n".join(parts) + "</body></html>\n")


LATEX_SPECIAL = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#",
                 "_": r"\_", "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}",
                 "^": r"\textasciicircum{}", "±": r"$\pm$", "↓": r"$\downarrow$",
                 "ε": r"$\varepsilon$", "σ": r"$\sigma$", "δ": r"$\delta$", "α": r"$\alpha$",
                 "∞": r"$\infty$", "†": r"$^\dagger$", "·": r"$\cdot$", "<": r"$<$",
                 ">": r"$>$", "‡": r"$^\ddagger$", "≥": r"$\geq$", "≈": r"$\approx$",
                 "Δ": r"$\Delta$", "ξ": r"$\xi$", "χ": r"$\chi$", "²": r"$^2$",
                 "×": r"$\times$", "−": "-"}
LATEX_PATTERN = re.compile("|".join(re.escape(k) for k in LATEX_SPECIAL))


def latex_escape(text: str) -> str:
    return LATEX_PATTERN.sub(lambda m: LATEX_SPECIAL[m.group()], text)


def latex_table(table: Table) -> str:
    def mark(text: str, how: str) -> str:
        text = latex_escape(text)
        return {"best": rf"\textbf{{{text}}}", "second": rf"\underline{{{text}}}"}.get(how, text)

    columns = "l" + "r" * (table.cells.shape[1] - 1)
    header = " & ".join(latex_escape(str(c)) for c in table.cells.columns)
    body = "\n".join(" & ".join(row) + r" \\" for row in _rows(table, mark))
    return (f"\\begin{{table}}[ht]\n\\centering\\small\n\\caption{{{latex_escape(table.title)}."
            f" {latex_escape(table.note)}}}\n\\begin{{tabular}}{{{columns}}}\n\\toprule\n"
            f"{header} \\\\\n\\midrule\n{body}\n\\bottomrule\n\\end{{tabular}}\n\\end{{table}}")


def latex(report: Report) -> str:
    parts = [r"\documentclass{article}", r"\usepackage{booktabs,graphicx}",
             r"\usepackage[margin=2cm,landscape]{geometry}", r"\begin{document}",
             rf"\section*{{{latex_escape(report.title)}}}",
             *[rf"\fbox{{\parbox{{\linewidth}}{{\textbf{{{latex_escape(line)}}}}}}}"
               for line in report.banner], latex_escape(report.summary)]
    for section in report.sections:
        parts.append(rf"\subsection*{{{latex_escape(section.title)}}}")
        if section.text:
            parts.append(latex_escape(section.text))
        parts += [latex_table(table) for table in section.tables]
        parts += [f"\\begin{{figure}}[ht]\\centering\\includegraphics[width=\\linewidth]"
                  f"{{figures/{plot.name}.png}}\\caption{{{latex_escape(plot.caption)}}}"
                  "\\end{figure}" for plot in section.plots]
    parts.append(r"\end{document}")
    return "\n\n".join(parts) + "\n"


RENDERERS = {"md": markdown, "html": html_page, "latex": latex}
