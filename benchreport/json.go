package benchreport

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
)

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
// schema 1 (whose cells name their throughput throughput_bps); another
// schema version is an error.
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
	case 1:
		b = bytes.ReplaceAll(b, []byte(`"throughput_bps":`), []byte(`"bytes_per_second":`))
	default:
		return nil, fmt.Errorf("benchreport: report schema %d, this build reads 1 and %d", head.Schema, Schema)
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
