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
