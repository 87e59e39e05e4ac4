//! `skillhost skills add`: installs a skill by URL and digest, or every
//! skill another server publishes, straight into the install folder with
//! the server's own guards (allowed hosts, digest before unpacking, the ZIP
//! guards, the scan and the uploads' install policy). No server needs to
//! run; one that does sees the skills on its next rescan.

use std::fmt::Write;
use std::path::Path;

use skillhost_actors::skills::discovery::{self, Artifact};
use skillhost_actors::skills::fetch::{self, Domains, MAX_INDEX_BYTES};
use skillhost_actors::skills::install::{install_archive, InstallError, InstallOptions, ZipLimits, MAX_ARCHIVE_BYTES};
use skillhost_actors::skills::registry::scan_under;
use skillhost_actors::skills::skill::MAX_SKILL_MD_BYTES;
use skillhost_actors::skills::SkillsConfig;
use url::Url;

use crate::config::SkillsAddArgs;

/// One artifact to fetch and install.
struct Source {
    /// The name the index gives it, if it came from one.
    listed_as: Option<String>,
    url: String,
    sha256: String,
    artifact: Artifact,
}

/// Runs `skills add`: the report, and whether every install went well.
pub fn add(args: SkillsAddArgs) -> Result<(String, bool), String> {
    let config = args
        .resolve_skills()
        .map_err(|err| err.to_string())?
        .ok_or("skills are off (--no-skills), so nothing can be installed")?;
    let install_dir = config.install_dir.clone().ok_or("there is no skills install folder")?;
    std::fs::create_dir_all(&install_dir)
        .map_err(|err| format!("cannot make the install folder {}: {err}", install_dir.display()))?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|err| format!("cannot start the fetcher: {err}"))?;
    let domains = &config.install_domains;
    let given = args.url.as_deref().ok_or("give the URL of an archive or of a server that publishes skills")?;
    let sources = match &args.sha256 {
        Some(digest) => vec![Source {
            listed_as: None,
            url: given.to_string(),
            sha256: fetch::parse_sha256(digest).map_err(|err| err.to_string())?,
            artifact: Artifact::Zip,
        }],
        None => runtime.block_on(read_index(given, domains))?,
    };
    let mut out = String::new();
    let mut all_ok = true;
    if sources.is_empty() {
        let _ = writeln!(out, "{given} publishes no skills.");
    }
    for source in &sources {
        let label = source.listed_as.as_deref().unwrap_or(&source.url);
        match install_one(&runtime, source, &config, &install_dir, args.overwrite) {
            Ok(line) => out.push_str(&line),
            Err(why) => {
                all_ok = false;
                let _ = writeln!(out, "not installed: {label}: {why}");
            }
        }
    }
    Ok((out, all_ok))
}

/// The entries of the index at (or under) `given`.
async fn read_index(given: &str, domains: &Domains) -> Result<Vec<Source>, String> {
    let index_url = index_url(given)?;
    let mut bytes = Vec::new();
    fetch::fetch(index_url.as_str(), domains, MAX_INDEX_BYTES, &mut bytes).await.map_err(|err| err.to_string())?;
    let index = discovery::parse_index(&bytes).map_err(|err| format!("{index_url}: {err}"))?;
    let mut sources = Vec::new();
    for entry in index.skills {
        let artifact = entry.artifact()?;
        let url =
            index_url.join(&entry.url).map_err(|err| format!("'{}' has the URL '{}': {err}", entry.name, entry.url))?;
        let sha256 = fetch::parse_sha256(&entry.digest).map_err(|err| format!("'{}': {err}", entry.name))?;
        sources.push(Source { listed_as: Some(entry.name), url: url.to_string(), sha256, artifact });
    }
    Ok(sources)
}

/// Where a server's index is: the URL itself when it names a `.json`
/// file, else the draft's path under it (a site may live under a path).
fn index_url(given: &str) -> Result<Url, String> {
    let mut url = Url::parse(given.trim()).map_err(|err| format!("'{given}' is not a URL: {err}"))?;
    let path = url.path().to_ascii_lowercase();
    if path.ends_with(".json") {
        return Ok(url);
    }
    if path.ends_with(".zip") {
        return Err(format!("{given} is an archive: give its digest with --sha256"));
    }
    if !url.path().ends_with('/') {
        let with_slash = format!("{}/", url.path());
        url.set_path(&with_slash);
    }
    url.join(discovery::INDEX_PATH.trim_start_matches('/')).map_err(|err| err.to_string())
}

/// Fetches, checks and installs one artifact; answers its report line.
fn install_one(
    runtime: &tokio::runtime::Runtime,
    source: &Source,
    config: &SkillsConfig,
    install_dir: &Path,
    overwrite: bool,
) -> Result<String, String> {
    // Staged inside the install folder, named as uploads are, so a
    // watching server ignores it and a crash leaves it to be swept.
    let staged = tempfile::Builder::new()
        .prefix(".upload-")
        .suffix(".zip")
        .tempfile_in(install_dir)
        .map_err(|err| format!("cannot stage the download: {err}"))?;
    let domains = &config.install_domains;
    let fetched = match source.artifact {
        Artifact::Zip => runtime.block_on(async {
            let reopened = staged.reopen().map_err(|err| format!("cannot stage the download: {err}"))?;
            let mut file = tokio::fs::File::from_std(reopened);
            fetch::fetch_verified(&source.url, &source.sha256, domains, MAX_ARCHIVE_BYTES, &mut file)
                .await
                .map_err(|err| err.to_string())
        })?,
        Artifact::SkillMd => {
            let mut text = Vec::new();
            let fetched = runtime
                .block_on(fetch::fetch_verified(&source.url, &source.sha256, domains, MAX_SKILL_MD_BYTES, &mut text))
                .map_err(|err| err.to_string())?;
            let zip = discovery::zip_skill_md(&text)?;
            std::fs::write(staged.path(), zip).map_err(|err| format!("cannot stage the download: {err}"))?;
            fetched
        }
    };
    let current = scan_under(&config.roots, config.policy.roots);
    let options = InstallOptions {
        overwrite,
        // The index's name is what the operator chose to install, and with
        // --overwrite it is what gets replaced: an entry whose archive holds
        // another skill is refused, so it can never replace that one.
        name: source.listed_as.clone(),
        limits: ZipLimits::default(),
        keep: config.keep_versions,
        policy: config.policy.installs,
    };
    let archive = staged.reopen().map_err(|err| format!("cannot read the download: {err}"))?;
    let installed = install_archive(archive, install_dir, &current, options).map_err(|err| match err {
        InstallError::Unsafe { message, findings } => {
            let mut text = message;
            for finding in findings {
                let _ = write!(text, "\n      {} {} at {}", finding.severity.as_str(), finding.rule, finding.place());
            }
            text
        }
        other => other.to_string(),
    })?;
    Ok(format!(
        "installed {} version {} from {} (sha256:{})\n",
        installed.name, installed.version, fetched.url, fetched.sha256
    ))
}
