"""Ships a .pth file, which Python runs at every start that reads the
site-packages folder it lands in: the host's installer must not be one."""
