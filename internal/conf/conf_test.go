package conf

import (
	"testing"
	"time"
)

func TestOr(t *testing.T) {
	if got := Or(0, 5); got != 5 {
		t.Errorf("Or(0, 5) = %d", got)
	}
	if got := Or(-time.Second, time.Minute); got != time.Minute {
		t.Errorf("Or(-1s, 1m) = %v", got)
	}
	if got := Or(int64(3), 9); got != 3 {
		t.Errorf("Or(3, 9) = %d", got)
	}
	if got := Or(0.5, 0.25); got != 0.5 {
		t.Errorf("Or(0.5, 0.25) = %v", got)
	}
}
