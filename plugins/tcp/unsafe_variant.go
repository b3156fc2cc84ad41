//go:build kvfenceunsafe

package tcp

// WithUnsafeVariant selects a known-unsafe variant by name (see unsafeMode).
// It exists only in builds with the kvfenceunsafe tag, which tests use.
func WithUnsafeVariant(cfg Config, name string) Config {
	cfg.unsafe = unsafeModeByName[name]
	return cfg
}
