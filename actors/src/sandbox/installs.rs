//! How the host installs packages for the model on this server: the
//! settings the installer runs under (which index, which registry, through
//! which proxy). What an install line asks for is read in `tools::install`.

/// Where the installer fetches from when the operator names nothing else.
pub const DEFAULT_PYTHON_INDEX: &str = "https://pypi.org/simple";
pub const DEFAULT_NPM_REGISTRY: &str = "https://registry.npmjs.org/";
/// The hosts the installer may reach by default: the index, where its
/// files are served, and the npm registry.
pub const DEFAULT_INSTALL_DOMAINS: [&str; 3] = ["pypi.org", "files.pythonhosted.org", "registry.npmjs.org"];

/// How the host installs on this server.
#[derive(Debug, Clone)]
pub struct InstallSettings {
    /// `--code-exec-allow-install`: with it off every recognised install is
    /// refused with one sentence naming the flag.
    pub allowed: bool,
    /// `--code-exec-packages`, normalised; empty allows any valid name.
    pub packages: Vec<String>,
    pub python_index: String,
    pub npm_registry: String,
    /// The install proxy: the one way out of the installer's own network.
    /// `None` runs the installer with no network at all.
    pub proxy: Option<super::egress::Egress>,
    /// The npm the host runs; `None` where the host has none.
    pub npm: Option<std::path::PathBuf>,
}

impl Default for InstallSettings {
    fn default() -> Self {
        InstallSettings {
            allowed: false,
            packages: Vec::new(),
            python_index: DEFAULT_PYTHON_INDEX.into(),
            npm_registry: DEFAULT_NPM_REGISTRY.into(),
            proxy: None,
            npm: None,
        }
    }
}
