"""How the golden generators' --check compares a golden file with a fresh computation."""


def same(old, new, tolerance=1e-9):
    """Whether two files' lines agree word for word, numbers within `tolerance` relative."""
    if len(old) != len(new):
        return False
    for a, b in zip(old, new):
        wa, wb = a.split(), b.split()
        if len(wa) != len(wb):
            print(f"differs: {a!r} / {b!r}")
            return False
        for x, y in zip(wa, wb):
            if x == y:
                continue
            try:
                fx, fy = float(x), float(y)
            except ValueError:
                print(f"differs: {a!r} / {b!r}")
                return False
            if abs(fx - fy) > tolerance * max(abs(fx), abs(fy)):
                print(f"differs: {a!r} / {b!r}")
                return False
    return True


def check_or_write(path, lines, argv):
    """With --check in argv: 0 when `path` agrees with `lines` (same), else 1.
    Without: writes `lines` to `path`. Prints what it did; returns the exit code."""
    if "--check" in argv[1:]:
        with open(path) as f:
            ok = same(f.read().splitlines(), lines)
        print(f"{path}: {'matches' if ok else 'differs from'} a fresh computation")
        return 0 if ok else 1
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    print(f"wrote {len(lines)} lines to {path}")
    return 0
