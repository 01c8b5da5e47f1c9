"""MkDocs hook: a `<!-- plan: STUDENT -->` line in a page becomes the plan `distillery plan --params params.yaml
--student STUDENT` prints (the demo student's stages and task-stage steps), made at every build from the code."""

import re
from pathlib import Path

MARKER = re.compile(r"^<!-- plan: ([\w-]+) -->$", re.MULTILINE)


def on_page_markdown(markdown, page, config, files):
    from distillery.recipes.cli import plan_lines

    params = Path(config["config_file_path"]).parent / "params.yaml"

    def block(m):
        lines = [f"$ distillery plan --student {m.group(1)}", *plan_lines(params, [m.group(1)])]
        return "```text\n" + "\n".join(lines) + "\n```"
    return MARKER.sub(block, markdown)
