// Package dbtx holds the small pieces of transaction handling that the idem
// and idemhttp packages share: the transaction handed to user code, whose
// end belongs to the library, the bounded rollback that cleans up after a
// failure, and the Execer interface.
package dbtx
