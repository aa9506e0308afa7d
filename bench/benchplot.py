"""What the bench reports share: writing the table, and matplotlib when it is installed."""
import sys


def write_table(out, table):
    """Writes `table` to OUT/table.md and prints it."""
    (out / "table.md").write_text(table)
    print(table)


def pyplot(who):
    """matplotlib.pyplot on the Agg backend, or None (saying so on stderr) without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print(f"{who}: matplotlib is not installed, so no plot", file=sys.stderr)
        return None
    return plt
