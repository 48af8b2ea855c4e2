// Package sentinel holds the errors that package idem exports and package
// schema returns too. schema cannot import idem (idem runs schema's SQL, so
// the import goes the other way); both take the values from here, and
// errors.Is matches them whichever package returned them.
package sentinel

import "errors"

var (
	// ErrInvalidTable is idem.ErrInvalidTable.
	ErrInvalidTable = errors.New("idem: invalid table name")
	// ErrInvalidOption is idem.ErrInvalidOption.
	ErrInvalidOption = errors.New("idem: invalid option")
)
