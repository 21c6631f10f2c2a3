// SPDX-License-Identifier: Apache-2.0

package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"text/tabwriter"
	"time"

	"github.com/dkc-dev/dkc/hack/internal/gitsource"
)

// licenseNames are the license files an archive carries when the repository has one: krew-index's
// validate-krew-manifest wants one of them installed with every plugin.
var licenseNames = []string{"LICENSE", "LICENSE.txt", "LICENSE.md", "COPYING"}

// source is what a release is built from.
type source struct {
	root    string    // the repository's top directory
	version string    // v<semver>
	created time.Time // every time in the archives
}

// run builds a release into c.out: an archive per platform, their checksums and the krew manifest, then
// prints what it wrote.
func run(ctx context.Context, c config, out io.Writer) error {
	start := time.Now()
	src, err := readSource(ctx, c.version)
	if err != nil {
		return err
	}
	baseURL := c.releaseURL
	if baseURL == "" {
		baseURL = releaseURLBase + src.version
	}
	if err := clearOutput(c.out); err != nil {
		return err
	}
	license, err := findLicense(src.root)
	if err != nil {
		return err
	}

	var published []publishedArchive
	var paths []string
	for _, p := range c.platforms {
		a, path, err := publishPlatform(ctx, c.out, src, license, p)
		if err != nil {
			return err
		}
		published, paths = append(published, a), append(paths, path)
	}
	sums := filepath.Join(c.out, checksumsName(src.version))
	if err := writeChecksums(sums, paths); err != nil {
		return err
	}
	if err := writeKrewManifest(c.out, src.version, baseURL, published); err != nil {
		return err
	}
	return printRelease(out, c.out, src, published, summary{baseURL: baseURL, sums: sums, license: license,
		start: start})
}

// clearOutput makes the output directory and removes an earlier release from it: a release directory holds
// one release, and archives, sums and manifest of an earlier version would sit beside this one's unlisted,
// and be uploaded with it.
func clearOutput(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("create output directory: %w", err)
	}
	stale, _ := filepath.Glob(filepath.Join(dir, cliBin+"_*"))
	for _, f := range append(stale, filepath.Join(dir, manifestFile)) {
		if err := os.Remove(f); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("remove the previous release's %s: %w", f, err)
		}
	}
	return nil
}

// publishPlatform builds p's archive in dir, with the license when there is one, and returns what the
// krew manifest says of it (read back from the archive written) and its path.
func publishPlatform(ctx context.Context, dir string, src source, license string, p platform) (
	publishedArchive, string, error) {
	entries, err := buildPlatform(ctx, src.root, filepath.Join(dir, "bin", p.os+"_"+p.arch), p, src.version)
	if err != nil {
		return publishedArchive{}, "", err
	}
	if license != "" {
		entries = append(entries, entry{name: filepath.Base(license), mode: 0o644, source: license})
	}
	a := publishedArchive{platform: p, name: archiveName(src.version, p)}
	path := filepath.Join(dir, a.name)
	if err := writeArchive(path, entries, src.created); err != nil {
		return publishedArchive{}, "", err
	}
	if a.files, err = readArchive(path); err != nil {
		return publishedArchive{}, "", err
	}
	if a.sha256, err = sha256File(path); err != nil {
		return publishedArchive{}, "", err
	}
	return a, path, nil
}

// writeKrewManifest writes the krew manifest of the published archives into dir, once it passes krew's
// own validation.
func writeKrewManifest(dir, version, baseURL string, published []publishedArchive) error {
	m, err := krewManifest(version, baseURL, published)
	if err != nil {
		return err
	}
	if err := validateManifest(pluginName, m); err != nil {
		return fmt.Errorf("krew manifest: %w", err)
	}
	y, err := marshalManifest(m)
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, manifestFile), y, 0o644); err != nil {
		return fmt.Errorf("krew manifest: %w", err)
	}
	return nil
}

// summary is what printRelease says of a release besides its archives.
type summary struct {
	baseURL string    // where the manifest's URIs point
	sums    string    // path of the checksums file
	license string    // path of the license the archives carry; "" for none
	start   time.Time // when the release started: the table ends with how long it took
}

// printRelease prints a table of the release in dir: each archive, the manifest and the checksums.
func printRelease(out io.Writer, dir string, src source, published []publishedArchive, s summary) error {
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	for _, a := range published {
		st, err := os.Stat(filepath.Join(dir, a.name))
		if err != nil {
			return err
		}
		fmt.Fprintf(tw, "%s\t%.1f MiB\t%d files\tsha256:%s\n", a.name, float64(st.Size())/(1<<20), len(a.files), a.sha256)
	}
	fmt.Fprintf(tw, "%s\tkrew manifest, URIs under %s\n", manifestFile, s.baseURL)
	fmt.Fprintf(tw, "%s\t(sha256sum -c)\n", filepath.Base(s.sums))
	lic := "none in the repository"
	if s.license != "" {
		lic = filepath.Base(s.license)
	}
	fmt.Fprintf(tw, "# %s, version %s, created %s, license %s; %s\n", filepath.Clean(dir), src.version,
		src.created.Format(time.RFC3339), lic, time.Since(s.start).Round(100*time.Millisecond))
	return tw.Flush()
}

// buildPlatform builds what p's archive holds and returns it as archive entries.
func buildPlatform(ctx context.Context, root, dir string, p platform, version string) ([]entry, error) {
	bin, err := buildCLI(ctx, dir, p, version)
	if err != nil {
		return nil, err
	}
	entries := []entry{{name: cliBin, mode: 0o755, source: bin}}
	if !shipsKubeletChecks(p) {
		return entries, nil
	}
	checks, err := buildKubeletChecks(ctx, root, dir, p)
	if err != nil {
		return nil, err
	}
	for _, c := range checks {
		entries = append(entries, entry{name: filepath.Base(c), mode: 0o755, source: c})
	}
	return entries, nil
}

// findLicense returns the repository's license file, or "" when it has none.
func findLicense(root string) (string, error) {
	for _, n := range licenseNames {
		p := filepath.Join(root, n)
		st, err := os.Stat(p)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return "", fmt.Errorf("license: %w", err)
		}
		if st.Mode().IsRegular() {
			return p, nil
		}
	}
	return "", nil
}

// readSource reads the release's provenance from git, as hack/images does: the top directory, the version
// (unless given: git describe, made a semver by releaseVersion) and the timestamp (SOURCE_DATE_EPOCH, else
// HEAD's commit time), so rebuilding a commit gives the same archives.
func readSource(ctx context.Context, version string) (source, error) {
	s := source{version: version}
	var err error
	if s.root, err = gitsource.Git(ctx, "rev-parse", "--show-toplevel"); err != nil {
		return s, err
	}
	if s.version == "" {
		describe, err := gitsource.Git(ctx, "describe", "--tags", "--always", "--dirty")
		if err != nil {
			return s, err
		}
		s.version = releaseVersion(describe)
	}
	if err := checkVersion(s.version); err != nil {
		return s, fmt.Errorf("release version: %w", err)
	}
	if s.created, err = gitsource.Created(ctx); err != nil {
		return s, err
	}
	return s, nil
}
