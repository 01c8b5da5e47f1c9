"""MkDocs hook: the params reference page (params.md), generated from the schema at every build
(`distillery.params_reference`), so it cannot drift from the code."""

from mkdocs.structure.files import File


def on_files(files, config):
    from distillery.params_reference import render

    files.append(File.generated(config, "params.md", content=render()))
    return files
