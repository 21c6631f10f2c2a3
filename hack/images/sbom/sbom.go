// SPDX-License-Identifier: Apache-2.0

// Package sbom writes the software bill of materials of an image as an SPDX 2.3 JSON document, from the
// Go build information every binary in the image carries (debug/buildinfo): the module each binary was
// built from, every module linked into it with its version and go.sum hash, and the Go standard library
// of the toolchain that built it. Nothing is scanned or guessed: what the linker recorded is what is
// listed, which is also what govulncheck and image scanners read from the binaries themselves.
//
// Written here rather than with an SPDX library because the document needs only a few of its fields, and
// neither SPDX's tools-golang nor cyclonedx-go is among this module's dependencies.
package sbom

import (
	"crypto/sha256"
	"debug/buildinfo"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path"
	"regexp"
	"runtime/debug"
	"strings"
	"time"
)

// Subject is what a document describes: one image for one platform.
type Subject struct {
	Image   string // e.g. dkc-server
	Version string // the build's version, for the image and for the binaries' own modules
	OS      string
	Arch    string
	// Repository and Revision say where this build's own modules come from (their downloadLocation).
	Repository string
	Revision   string
	// Created is the document's creation time: the build's timestamp, so a rebuild writes the same bytes.
	Created time.Time
}

// Binary is a Go binary in the image.
type Binary struct {
	Path   string // in the image, e.g. /usr/local/bin/dkc-server
	Source string // on the build host
}

// Document is the subset of an SPDX 2.3 document (spdx.github.io/spdx-spec/v2.3) this package writes.
type Document struct {
	SPDXVersion       string         `json:"spdxVersion"`
	DataLicense       string         `json:"dataLicense"`
	SPDXID            string         `json:"SPDXID"`
	Name              string         `json:"name"`
	DocumentNamespace string         `json:"documentNamespace"`
	CreationInfo      CreationInfo   `json:"creationInfo"`
	Packages          []Package      `json:"packages"`
	Relationships     []Relationship `json:"relationships"`
}

type CreationInfo struct {
	Created  string   `json:"created"`
	Creators []string `json:"creators"`
}

type Package struct {
	SPDXID                string        `json:"SPDXID"`
	Name                  string        `json:"name"`
	VersionInfo           string        `json:"versionInfo,omitempty"`
	DownloadLocation      string        `json:"downloadLocation"`
	FilesAnalyzed         bool          `json:"filesAnalyzed"`
	PrimaryPackagePurpose string        `json:"primaryPackagePurpose,omitempty"`
	Checksums             []Checksum    `json:"checksums,omitempty"`
	LicenseConcluded      string        `json:"licenseConcluded"`
	LicenseDeclared       string        `json:"licenseDeclared"`
	CopyrightText         string        `json:"copyrightText"`
	ExternalRefs          []ExternalRef `json:"externalRefs,omitempty"`
	Comment               string        `json:"comment,omitempty"`
}

type Checksum struct {
	Algorithm     string `json:"algorithm"`
	ChecksumValue string `json:"checksumValue"`
}

type ExternalRef struct {
	ReferenceCategory string `json:"referenceCategory"`
	ReferenceType     string `json:"referenceType"`
	ReferenceLocator  string `json:"referenceLocator"`
}

type Relationship struct {
	SPDXElementID      string `json:"spdxElementId"`
	RelationshipType   string `json:"relationshipType"`
	RelatedSPDXElement string `json:"relatedSpdxElement"`
}

// SPDX constants the documents use.
const (
	Version     = "SPDX-2.3"
	DocumentID  = "SPDXRef-DOCUMENT"
	NoAssertion = "NOASSERTION"
	// Creator names this tool in creationInfo.
	Creator = "Tool: dkc-hack-images"
)

// New reads the build information of bins and describes them as parts of the subject image:
// DOCUMENT DESCRIBES image, image CONTAINS each binary, a binary GENERATED_FROM its main module and
// DEPENDS_ON each module linked into it and the standard library. A module several binaries link is one
// package with a relationship from each.
func New(s Subject, bins []Binary) (Document, error) {
	created := s.Created.UTC().Truncate(time.Second)
	d := Document{
		SPDXVersion:  Version,
		DataLicense:  "CC0-1.0",
		SPDXID:       DocumentID,
		Name:         fmt.Sprintf("%s %s/%s", s.Image, s.OS, s.Arch),
		CreationInfo: CreationInfo{Created: created.Format(time.RFC3339), Creators: []string{Creator}},
	}
	ids := newIDs()
	imageID := ids.id("Image-" + s.Image)
	d.Packages = append(d.Packages, Package{
		SPDXID: imageID, Name: s.Image, VersionInfo: s.Version, DownloadLocation: NoAssertion,
		PrimaryPackagePurpose: "CONTAINER", Comment: fmt.Sprintf("the %s/%s image of %s", s.OS, s.Arch, s.Image),
	})
	d.Relationships = append(d.Relationships, Relationship{DocumentID, "DESCRIBES", imageID})

	modules := map[string]string{} // path@version -> SPDXID
	module := func(p Package, key string) string {
		if id, ok := modules[key]; ok {
			return id
		}
		p.SPDXID = ids.id("Module-" + key)
		modules[key] = p.SPDXID
		d.Packages = append(d.Packages, p)
		return p.SPDXID
	}
	// The namespace must be unique per document: it is derived from what the document describes, so a
	// rebuild of the same binaries gives the same document and any other build another.
	ns := sha256.New()
	fmt.Fprintf(ns, "%s %s/%s %s\n", s.Image, s.OS, s.Arch, s.Version)
	for _, b := range bins {
		info, sum, err := read(b.Source)
		if err != nil {
			return d, fmt.Errorf("sbom of %s: binary %s: %w", s.Image, b.Path, err)
		}
		fmt.Fprintf(ns, "%s %s\n", b.Path, sum)
		binID := ids.id("Binary-" + path.Base(b.Path))
		d.Packages = append(d.Packages, Package{
			SPDXID: binID, Name: path.Base(b.Path), VersionInfo: s.Version, DownloadLocation: NoAssertion,
			PrimaryPackagePurpose: "APPLICATION", Checksums: []Checksum{{"SHA256", sum}},
			Comment: fmt.Sprintf("%s in the image; built by %s from %s%s", b.Path, info.GoVersion, info.Path, settings(info)),
		})
		d.Relationships = append(d.Relationships, Relationship{imageID, "CONTAINS", binID})

		// The main module of a build in a work tree is "(devel)": this build's version names it instead.
		mainVersion := info.Main.Version
		if mainVersion == "" || mainVersion == "(devel)" {
			mainVersion = s.Version
		}
		mainPkg := modulePackage(info.Main.Path, mainVersion, info.Main.Sum, "")
		if s.Repository != "" {
			mainPkg.DownloadLocation = "git+" + s.Repository + ".git"
			if s.Revision != "" {
				mainPkg.DownloadLocation += "@" + s.Revision
			}
		}
		d.Relationships = append(d.Relationships,
			Relationship{binID, "GENERATED_FROM", module(mainPkg, info.Main.Path+"@"+mainVersion)})

		std := strings.TrimPrefix(info.GoVersion, "go")
		d.Relationships = append(d.Relationships, Relationship{binID, "DEPENDS_ON", module(Package{
			Name: "stdlib", VersionInfo: std, DownloadLocation: NoAssertion,
			ExternalRefs: []ExternalRef{purl("stdlib", std)},
			Comment:      "the Go standard library of " + info.GoVersion,
		}, "stdlib@"+std)})
		for _, dep := range info.Deps {
			m, replaced := dep, ""
			if dep.Replace != nil {
				m, replaced = dep.Replace, dep.Path+"@"+dep.Version
			}
			p := modulePackage(m.Path, m.Version, m.Sum, replaced)
			d.Relationships = append(d.Relationships, Relationship{binID, "DEPENDS_ON", module(p, m.Path+"@"+m.Version)})
		}
	}
	d.DocumentNamespace = fmt.Sprintf("https://github.com/dkc-dev/dkc/spdx/%s-%s-%s-%x", s.Image, s.OS, s.Arch,
		ns.Sum(nil)[:16])
	for i := range d.Packages {
		d.Packages[i].LicenseConcluded, d.Packages[i].LicenseDeclared, d.Packages[i].CopyrightText =
			NoAssertion, NoAssertion, NoAssertion
	}
	return d, nil
}

// JSON is the document as written to disk and into the image.
func (d Document) JSON() ([]byte, error) {
	b, err := json.MarshalIndent(d, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("encode SPDX document %s: %w", d.Name, err)
	}
	return append(b, '\n'), nil
}

// modulePackage describes a Go module. The go.sum hash (h1:, a SHA-256 over the module's files, Go's
// dirhash) is kept verbatim in the comment and, decoded, as the package's SHA256 checksum, which is how
// SBOM tools that read Go binaries (syft) record it; it is not a hash of a downloadable file.
func modulePackage(modPath, version, sum, replaces string) Package {
	p := Package{Name: modPath, VersionInfo: version, DownloadLocation: NoAssertion}
	if version != "" {
		p.ExternalRefs = []ExternalRef{purl(modPath, version)}
	}
	var notes []string
	if sum != "" {
		notes = append(notes, "go.sum "+sum)
		if raw, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(sum, "h1:")); err == nil &&
			strings.HasPrefix(sum, "h1:") && len(raw) == sha256.Size {
			p.Checksums = []Checksum{{"SHA256", hex.EncodeToString(raw)}}
		}
	}
	if replaces != "" {
		notes = append(notes, "replaces "+replaces)
	}
	p.Comment = strings.Join(notes, "; ")
	return p
}

func purl(modPath, version string) ExternalRef {
	return ExternalRef{ReferenceCategory: "PACKAGE-MANAGER", ReferenceType: "purl",
		ReferenceLocator: "pkg:golang/" + modPath + "@" + version}
}

// read returns a binary's build information and the SHA-256 of its bytes.
func read(file string) (*debug.BuildInfo, string, error) {
	info, err := buildinfo.ReadFile(file)
	if err != nil {
		return nil, "", fmt.Errorf("read Go build info: %w", err)
	}
	f, err := os.Open(file)
	if err != nil {
		return nil, "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return nil, "", fmt.Errorf("hash: %w", err)
	}
	return info, hex.EncodeToString(h.Sum(nil)), nil
}

// settings lists the build settings that say what the binary runs on.
func settings(info *debug.BuildInfo) string {
	var out []string
	for _, s := range info.Settings {
		switch s.Key {
		case "GOOS", "GOARCH", "GOAMD64", "GOARM64", "CGO_ENABLED":
			out = append(out, s.Key+"="+s.Value)
		}
	}
	if len(out) == 0 {
		return ""
	}
	return " (" + strings.Join(out, " ") + ")"
}

// ids hands out SPDX identifiers: SPDXRef- and letters, digits, '.' and '-' only, unique in a document.
type ids map[string]bool

func newIDs() ids { return ids{} }

var notIDChar = regexp.MustCompile(`[^A-Za-z0-9.-]+`)

func (s ids) id(name string) string {
	base := "SPDXRef-" + strings.Trim(notIDChar.ReplaceAllString(name, "-"), "-")
	id := base
	for n := 2; s[id]; n++ {
		id = fmt.Sprintf("%s-%d", base, n)
	}
	s[id] = true
	return id
}
