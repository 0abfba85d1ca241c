"""`python -m wellfed.compare`: the same as `wellfed-compare`."""

from wellfed.compare.command import main

if __name__ == "__main__":
    main()
