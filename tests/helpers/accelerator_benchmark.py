"""The rows of the tables benchmarks.accelerator prints."""


def table_lines(out: str, columns: tuple[str, ...]) -> list[list[str]]:
    """The rows (split on 2+ spaces) of the printed table whose header is `columns`."""
    lines = out.splitlines()
    header = next(i for i, line in enumerate(lines) if line.split() == " ".join(columns).split())
    rows = []
    for line in lines[header + 2 :]:
        if not line.strip():
            break
        rows.append([cell.strip() for cell in line.split("  ") if cell.strip()])
    return rows
