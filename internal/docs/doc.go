// Package docs holds no code, only tests that keep the repository's documents true: every
// requirement ID (ADM-3, PLC-6, …), field case (C01…C32), STYLE habit and SPEC section the
// tree cites is explained in docs/REQUIREMENTS.md, since SPEC.md, CASES.md and STYLE.md do not
// ship with it.
package docs
