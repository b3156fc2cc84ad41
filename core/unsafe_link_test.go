package core

// Core's tests run the known-unsafe variants to show each rule is needed:
// they link the unsafe policies, which the package itself never does.
import _ "github.com/kvfence/kvfence/internal/unsafecore"
