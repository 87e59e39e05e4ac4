def main():
    print('hi')
    return 1


def helper():
    return 3
