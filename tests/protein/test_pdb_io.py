"""Reading chains through gemmi (PDB, mmCIF, gzip), non-standard residues, chain breaks, writing
PDB and mmCIF, and clear errors for files that are not protein structures."""

import gzip

import gemmi
import pytest
import torch

from protein.pdb_io import BACKBONE_ATOMS, chain_breaks, read_chain, read_chains, write_structure

KUNITZ = "DYKDDDDKLKPDFCFLEEDPGICRGYITRYFYNNQTKQCERFKYGGCLGNMNNFETLEECKNICEDGPNGF"
"""1ADZ's chain as deposited (a FLAG tag, then the second Kunitz domain of TFPI)."""


def test_reads_an_nmr_model_in_pdb_mmcif_and_gzip(nmr_ensemble, tmp_path):
    chain = read_chain(nmr_ensemble)
    assert chain.name == "A" and chain.sequence == KUNITZ
    assert chain.coordinates.shape == (71, 5, 3) and chain.atom_mask[:, :4].all()
    assert torch.equal(chain.atom_mask[:, 4], torch.tensor([c != "G" for c in KUNITZ]))  # glycine has no CB
    assert not chain_breaks(chain.coordinates, chain.atom_mask).any()
    ca_ca = (chain.coordinates[1:, 1] - chain.coordinates[:-1, 1]).norm(dim=-1)
    assert ((ca_ca > 3.7) & (ca_ca < 3.9)).all()  # trans peptides: 3.8 Å
    other = read_chain(nmr_ensemble, model=7)
    assert other.sequence == KUNITZ and not torch.equal(other.coordinates, chain.coordinates)
    structure = gemmi.read_structure(str(nmr_ensemble))
    structure.setup_entities()
    cif = tmp_path / "1adz.cif.gz"
    cif.write_bytes(gzip.compress(structure.make_mmcif_document().as_string().encode()))
    again = read_chain(cif)
    assert again.sequence == KUNITZ and torch.equal(again.coordinates, chain.coordinates)


def test_write_then_read_round_trip_with_b_factors(nmr_ensemble, tmp_path):
    chain = read_chain(nmr_ensemble)
    path = tmp_path / "out.pdb"
    write_structure(path, chain.sequence, chain.coordinates, chain.atom_mask, b_factors=torch.linspace(0, 100, 71))
    back = read_chain(path)
    assert back.sequence == KUNITZ and torch.equal(back.atom_mask, chain.atom_mask)
    assert (back.coordinates - chain.coordinates).abs().max() < 1e-3  # PDB keeps 3 decimals
    b = [a.b_iso for r in gemmi.read_structure(str(path))[0]["A"] for a in r if a.name == "CA"]
    assert b[0] == 0.0 and b[-1] == 100.0
    write_structure(tmp_path / "ca.pdb", "gax", chain.coordinates[:3, 1:2])  # Cα only, lower case, unknown residue
    assert read_chain(tmp_path / "ca.pdb").sequence == "GAX"
    mmcif = tmp_path / "out.cif"
    write_structure(mmcif, chain.sequence, chain.coordinates, chain.atom_mask, b_factors=torch.linspace(0, 100, 71))
    assert mmcif.read_text().startswith("data_out")
    back = read_chain(mmcif)
    assert back.sequence == KUNITZ and torch.equal(back.atom_mask, chain.atom_mask)
    assert (back.coordinates - chain.coordinates).abs().max() < 1e-3
    assert [a.b_iso for r in gemmi.read_structure(str(mmcif))[0]["A"] for a in r if a.name == "CA"][-1] == 100.0


def test_non_standard_residues_breaks_and_numbering(nmr_ensemble, tmp_path):
    lines = [line for line in nmr_ensemble.read_text().splitlines() if line.startswith("ATOM")][:2000]
    model_one = []
    for line in lines:
        if line[22:26].strip() == "71":
            break
        model_one.append(line)
    edited = []
    for line in model_one:
        number = int(line[22:26])
        if number == 20:  # residue 20 removed: a chain break between 19 and 21
            continue
        if number == 2:  # Tyr 2 renamed to selenomethionine's code, MSE -> M
            line = "HETATM" + line[6:17] + "MSE" + line[20:]
        if number == 3:  # Lys 3 as an untabulated residue: X
            line = line[:17] + "ZZZ" + line[20:]
        edited.append(line)
    path = tmp_path / "edited.pdb"
    path.write_text("\n".join(edited) + "\nEND\n")
    chain = read_chain(path)
    assert chain.sequence[:4] == "DMXD" and len(chain.sequence) == 69
    breaks = chain_breaks(chain.coordinates, chain.atom_mask)
    assert breaks.nonzero().squeeze(1).tolist() == [18]  # between residues 19 and 21 (positions 18, 19)
    assert chain.residue_index[18:20].tolist() == [19, 21]


def test_every_protein_chain_of_a_file_from_one_read(nmr_ensemble, tmp_path):
    """read_chains: the protein chains of a file in file order, each as read_chain reads it alone;
    a water chain is left out."""
    model_one = []
    for line in nmr_ensemble.read_text().splitlines():
        if line.startswith("ENDMDL"):
            break
        if line.startswith("ATOM"):
            model_one.append(line)
    second = [line[:21] + "B" + line[22:30] + f"{float(line[30:38]) + 40.0:8.3f}" + line[38:] for line in model_one]
    water = "HETATM 9999  O   HOH W   1      10.000  10.000  10.000  1.00  0.00           O"
    path = tmp_path / "two.pdb"
    path.write_text("\n".join([*model_one, "TER", *second, "TER", water]) + "\nEND\n")
    chains = read_chains(path)
    assert [chain.name for chain in chains] == ["A", "B"]
    for chain in chains:
        alone = read_chain(path, chain.name)
        assert chain.sequence == alone.sequence and torch.equal(chain.coordinates, alone.coordinates)
        assert torch.equal(chain.atom_mask, alone.atom_mask) and torch.equal(chain.residue_index, alone.residue_index)
    shift = chains[1].coordinates[..., 0] - chains[0].coordinates[..., 0]
    assert torch.allclose(shift[chains[0].atom_mask], torch.tensor(40.0), atol=1e-3)


def test_bad_files_and_arguments_are_named(nmr_ensemble, tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        read_chain(tmp_path / "missing.pdb")
    garbage = tmp_path / "garbage.cif"
    garbage.write_text("data_x\nloop_\n_atom_site.id\n1 2 3\n")
    with pytest.raises(ValueError, match="garbage.cif"):
        read_chain(garbage)
    water = tmp_path / "water.pdb"
    water.write_text("HETATM    1  O   HOH A   1       0.000   0.000   0.000  1.00  0.00           O\nEND\n")
    with pytest.raises(ValueError, match="no protein chain"):
        read_chain(water)
    with pytest.raises(ValueError, match=r"chain must be one of the protein chains \['A'\]"):
        read_chain(nmr_ensemble, chain="Q")
    with pytest.raises(ValueError, match=r"model must be in \[0, 30\)"):
        read_chain(nmr_ensemble, model=30)
    with pytest.raises(ValueError, match=r"path must end in one of \['.cif', '.ent', '.mmcif', '.pdb'\].*x.xyz"):
        write_structure(tmp_path / "x.xyz", "AAA", torch.zeros(3, 1, 3))
    with pytest.raises(ValueError, match="coordinates must be"):
        write_structure(tmp_path / "x.pdb", "AAA", torch.zeros(2, len(BACKBONE_ATOMS), 3))
    with pytest.raises(ValueError, match="sequence has '1' at position 2"):
        write_structure(tmp_path / "x.pdb", "AA1", torch.zeros(3, 1, 3))
