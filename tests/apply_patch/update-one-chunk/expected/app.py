def main():
    print('hello')
    return 0


def helper():
    return 2
