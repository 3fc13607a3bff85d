def main(argv=None):
    print("hi")
    return 0
