package benchreport

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"regexp"
)

// legacyVerified matches a schema 1 or 2 cell's verified string.
var legacyVerified = regexp.MustCompile(`"verified":\s*"(yes|failed|skipped)"`)

// WriteJSON writes r as indented JSON.
func WriteJSON(w io.Writer, r *Report) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(r); err != nil {
		return fmt.Errorf("benchreport: encode report: %w", err)
	}
	return nil
}

// ReadJSON decodes a report written by WriteJSON, of this schema or of
// schemas 1 and 2 (1 names a cell's throughput throughput_bps; both write
// verified as "yes", "failed" or "skipped", read as true, false, and false
// with not_verified "skipped"); another schema version is an error.
func ReadJSON(rd io.Reader) (*Report, error) {
	b, err := io.ReadAll(rd)
	if err != nil {
		return nil, fmt.Errorf("benchreport: read report: %w", err)
	}
	var head struct {
		Schema int `json:"schema"`
	}
	if err := json.Unmarshal(b, &head); err != nil {
		return nil, fmt.Errorf("benchreport: decode report: %w", err)
	}
	switch head.Schema {
	case Schema:
	case 1, 2:
		b = bytes.ReplaceAll(b, []byte(`"throughput_bps":`), []byte(`"bytes_per_second":`))
		b = legacyVerified.ReplaceAllFunc(b, func(m []byte) []byte {
			switch {
			case bytes.HasSuffix(m, []byte(`"yes"`)):
				return []byte(`"verified": true`)
			case bytes.HasSuffix(m, []byte(`"skipped"`)):
				return []byte(`"verified": false, "not_verified": "skipped"`)
			}
			return []byte(`"verified": false`)
		})
	default:
		return nil, fmt.Errorf("benchreport: report schema %d, this build reads 1 to %d", head.Schema, Schema)
	}
	var r Report
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&r); err != nil {
		return nil, fmt.Errorf("benchreport: decode report: %w", err)
	}
	return &r, nil
}

// SaveJSON writes r to path (created or truncated).
func SaveJSON(path string, r *Report) error {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("benchreport: %w", err)
	}
	if err := WriteJSON(f, r); err != nil {
		f.Close()
		return fmt.Errorf("benchreport: write %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("benchreport: write %s: %w", path, err)
	}
	return nil
}

// LoadJSON reads a report from path.
func LoadJSON(path string) (*Report, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("benchreport: %w", err)
	}
	defer f.Close()
	r, err := ReadJSON(f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return r, nil
}
