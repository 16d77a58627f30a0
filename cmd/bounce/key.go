package main

import (
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/spf13/cobra"

	"github.com/bouncekv/bounce/security"
)

func newKeyCmd() *cobra.Command {
	var out string
	cmd := &cobra.Command{
		Use:   "key",
		Short: "Print this agent's public key, generating its key file on first use",
		Long: `key loads security.key_file (creating it, mode 0600, when it does not
exist) and prints the agent's name and public key as one allowed_peers
entry, NAME=KEY. Give that line to the peers that must admit this agent
(their security.allowed_peers, or a file of such lines named with @FILE).
Peers that load this agent's descriptor need nothing: the descriptor
carries the key.`,
		Example: `  bounce key --security.key-file /etc/bounce/agent.key --agent.name prefill-0
  bounce key --security.key-file a.key --agent.name host-a --out host-a.peer
  bounce serve --security.allowed-peers "loaded,$(bounce key --security.key-file send.key --agent.name send)"`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			l, err := loadConfig(cmd)
			if err != nil {
				return err
			}
			if l.Config.Security.KeyFile == "" {
				return usage(errors.New("security.key_file is empty: a key without a file would be new on every start; set --security.key-file"))
			}
			id, _, err := security.LoadOrCreate(l.Config.Security.KeyFile)
			if err != nil {
				return usage(err) // as every command that reads the key file
			}
			line := fmt.Sprintf("%s=%s\n", l.Config.Agent.Name, id.Public.Text())
			if out == "" {
				_, err := io.WriteString(cmd.OutOrStdout(), line)
				return err
			}
			// A public key: readable by others, written whole or not at all.
			tmp := out + ".tmp"
			if err := os.WriteFile(tmp, []byte(line), 0o644); err != nil {
				return failed(fmt.Errorf("write --out: %w", err))
			}
			if err := os.Rename(tmp, out); err != nil {
				return failed(fmt.Errorf("write --out: %w", err))
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&out, "out", "", "write the NAME=KEY line to this file (for a peer's security.allowed_peers @FILE) instead of stdout")
	configFlags(cmd)
	return cmd
}
