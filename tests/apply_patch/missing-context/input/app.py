def main():
    print('hello')
    return 1


def helper():
    return 2
