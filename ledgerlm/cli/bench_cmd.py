def register(subparsers):
    pass
