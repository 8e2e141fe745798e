/* probe_b.c - the second definition of probe_value (see probe_a.c). */
int probe_value(void);
int probe_b_id(void);

int probe_value(void) {
  return 'b';
}

int probe_b_id(void) {
  return 'B';
}
